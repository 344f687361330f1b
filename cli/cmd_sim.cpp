// `tandem sim`: replays a trace of requests against a roster under each policy (tandem and the
// baselines) on a simulated clock, and prints one table (or JSON, or an SVG of TTFT CDFs).
#include <cstdio>
#include <fstream>
#include <memory>
#include <stdexcept>

#include "cli/command_registry.h"
#include "configs/roster_loader.h"
#include "configs/trace_loader.h"
#include "policy/sim.h"
#include "policy/sim_report.h"

namespace tandem::cli {
namespace {

struct sim_args {
  std::string roster, trace, plot;
  std::vector<std::string> policies{"tandem", "exclusive", "lru-keepalive", "static"};
  bool has_seed = false;
  uint64_t seed = 0;
  bool json = false;
};

void run_sim(const sim_args& a) {
  const auto roster = configs::load_roster(a.roster, {.require_files = false});
  const auto trace = configs::load_trace(a.trace, roster);
  const auto requests = policy::expand_trace(trace, a.has_seed ? a.seed : trace.seed);
  std::vector<policy::sim_result> results;
  for (const auto& name : a.policies) {
    auto r = roster;
    r.policy.name = name;
    results.push_back(policy::simulate(r, trace, requests));
  }
  const std::string out = a.json ? policy::sim_to_json(results).dump() + "\n" : policy::format_sim_table(results);
  std::fwrite(out.data(), 1, out.size(), stdout);
  if (!a.plot.empty()) {
    std::ofstream f(a.plot, std::ios::binary);
    f << policy::sim_plot_svg(results, "TTFT, " + trace.source + " on " + roster.source);
    if (!f) throw std::runtime_error("cannot write " + a.plot);
  }
}

void add_sim_command(CLI::App& root) {
  auto a = std::make_shared<sim_args>();
  auto* cmd = root.add_subcommand("sim", "Replay a request trace against a roster under each policy on a simulated clock");
  cmd->add_option("--roster", a->roster, "roster YAML (model files need not exist when sizes are stated)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--trace", a->trace, "trace YAML (costs, objectives, arrivals)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--policies", a->policies, "policies to compare")
      ->check(CLI::IsMember({"tandem", "exclusive", "lru-keepalive", "static"}))
      ->capture_default_str();
  cmd->add_option("--seed", a->seed, "replace the trace's generator seed (the same shape, another day)")->each([a](const std::string&) {
    a->has_seed = true;
  });
  cmd->add_flag("--json", a->json, "one JSON object keyed by policy, then model");
  cmd->add_option("--plot", a->plot, "write the TTFT CDFs per policy and model to this SVG file");
  cmd->callback([a] { run_sim(*a); });
}

const command_registrar reg{"sim", &add_sim_command};

}  // namespace
}  // namespace tandem::cli
