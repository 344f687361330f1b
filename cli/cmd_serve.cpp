// `tandem serve`: opens every model of a roster, places them by its policy, and serves the
// HTTP API (api/) until SIGINT or SIGTERM, then shuts down gracefully. `--check` only
// validates the roster (model files need not exist when it states their sizes).
#include <csignal>
#include <filesystem>
#include <cstdio>
#include <memory>
#include <stdexcept>
#include <thread>

#include <pthread.h>
#include <unistd.h>
#include <spdlog/spdlog.h>

#include "cli/log.h"
#include "api/http_server.h"
#include "api/router.h"
#include "api/server_context.h"
#include "cli/command_registry.h"
#include "configs/byte_size.h"
#include "configs/duration.h"
#include "configs/roster_loader.h"
#include "runtime/roster_check.h"
#include "runtime/served_roster.h"

namespace tandem::cli {
namespace {

struct serve_args {
  std::string roster, listen, grace = "10s";
  int threads = 0;
  int http_threads = 2;
  bool check = false;
};

void print_summary(const configs::roster& r, const runtime::served_roster* s, const std::string& address) {
  using configs::format_byte_size;
  const auto& d = r.devices.front();
  std::string out = "tandem: roster " + r.source + "\n";
  out += "  device " + d.name + ": " + (s ? s->backend().info().name : std::string(configs::backend_name(d.backend))) + ", budget " +
         format_byte_size(d.vram) + " device, " + format_byte_size(d.host) + " pinned host\n";
  for (const auto& m : r.models) {
    out += "  model " + m.name + " (" + configs::role_name(m.role) + ", priority " + std::to_string(m.priority) + (m.pinned ? ", pinned" : "") +
           ", keep_alive " + (m.keep_alive.forever ? std::string("forever") : configs::format_duration(m.keep_alive.after)) + ", " +
           std::to_string(m.max_sequences) + " x " + std::to_string(m.context) + " positions): " + m.file + "\n";
  }
  for (const auto& k : r.skipped) out += "  skipped optional model " + k + "\n";
  out += "  policy " + r.policy.name + (r.policy.home.empty() ? "" : ", home " + r.policy.home) + "\n";
  if (!address.empty()) out += "tandem: listening on http://" + address + "\n";
  std::fputs(out.c_str(), stdout);
  std::fflush(stdout);
}

// On a terminal, the preloads' progress until they have landed (/health answers 503 until then).
void show_loading(runtime::served_roster& served) {
  if (!isatty(STDERR_FILENO)) return;
  bool shown = false;
  while (!served.ready()) {
    uint64_t landed = 0, total = 0;
    for (const auto& m : served.arbiter().snapshot().models)
      for (const auto& seg : m.segments)
        if (seg.device != memory::residency::absent) {
          total += seg.bytes;
          if (seg.device == memory::residency::resident) landed += seg.bytes;
        }
    std::fprintf(stderr, "\rtandem: loading weights to the device: %s / %s   ", configs::format_byte_size(landed).c_str(),
                 configs::format_byte_size(total).c_str());
    shown = true;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (shown) std::fputs("\rtandem: weights loaded                                          \n", stderr);
}

void run_serve(const serve_args& a) {
  if (a.check) {
    // serve's placement checks, on each model's file where it is there (opened as serve opens
    // it, nothing allocated), else on the sizes the roster states.
    const auto r = configs::load_roster(a.roster, {.require_files = false});
    std::vector<std::unique_ptr<models::model>> opened;
    std::vector<runtime::model_needs> needs;
    for (const auto& e : r.models) {
      std::error_code ec;
      std::unique_ptr<models::model> m;
      if (std::filesystem::is_regular_file(e.file, ec)) {
        try {
          // As serve opens it: packed for the CPU kernels, the file layout on a CUDA device.
          const bool cuda = r.devices.front().backend == configs::backend_choice::cuda;
          m = std::make_unique<models::model>(e.file, models::load_options{.pack_weights = !cuda, .own_weights = false});
        } catch (const std::exception& ex) {
          throw std::runtime_error("model '" + e.name + "' (" + e.file + "): " + ex.what());
        }
      }
      needs.push_back(runtime::needs_of(e, m.get(), runtime::kv_type_of(e.kv_type)));
      opened.push_back(std::move(m));
    }
    const size_t unit = runtime::page_unit_of(needs);
    runtime::check_placement(r, needs, unit);
    print_summary(r, nullptr, "");
    for (size_t i = 0; i < needs.size(); ++i) {
      const auto& n = needs[i];
      const auto ks = runtime::kv_shape_for(*n.entry, n.kv_bytes_per_token, unit);
      const int32_t room = runtime::kv_pages_beside_weights(r, needs, unit, i);
      std::printf("  kv %s (%s%s): pages of %s (%lld positions), at most %d (%s), %d kept (%s), %d beside its weights (%lld positions)%s\n",
                  n.entry->name.c_str(), kernels::cpu::kv_type_name(runtime::kv_type_of(n.entry->kv_type)),
                  runtime::kv_rotate_of(*n.entry) ? ", rotated" : "", configs::format_byte_size(ks.page_bytes).c_str(),
                  static_cast<long long>(configs::k_kv_block_tokens), ks.limit_blocks,
                  configs::format_byte_size(static_cast<uint64_t>(ks.limit_blocks) * ks.page_bytes).c_str(), ks.reserve_blocks,
                  configs::format_byte_size(static_cast<uint64_t>(ks.reserve_blocks) * ks.page_bytes).c_str(), room,
                  static_cast<long long>(room) * configs::k_kv_block_tokens, n.from_file ? "" : " [stated sizes]");
    }
    std::puts("tandem: roster OK");
    return;
  }
  const auto grace = configs::parse_duration(a.grace);
  if (!grace) throw std::runtime_error("--shutdown-grace '" + a.grace + "': expected a duration such as 10s");
  auto roster = configs::load_roster(a.roster);
  if (!a.listen.empty()) roster.server.listen = a.listen;
  auto hc = api::http_config_of(roster.server);
  hc.threads = a.http_threads;
  if (hc.host != "127.0.0.1" && hc.host != "::1" && roster.server.api_keys.empty())
    cli::logger().warn("serve: listening on {} without api_keys: anyone who can reach it may use the models", hc.host);

  // Signals are taken by sigwait below: block them before any thread starts so that none of
  // the engine's or the server's threads receives them.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);

  runtime::serve_options so;
  so.threads = a.threads;
  runtime::served_roster served(roster, so);
  api::server_context ctx(served, roster.server);
  hc.admit = api::make_admission(ctx);
  api::http_server server(hc, api::make_router(ctx));
  const std::string address = (hc.host.find(':') != std::string::npos ? "[" + hc.host + "]" : hc.host) + ":" + std::to_string(server.port());
  show_loading(served);
  print_summary(served.roster(), &served, address);

  int sig = 0;
  sigwait(&sigs, &sig);
  std::fprintf(stderr, "tandem: %s: stopping (in-flight requests have %s)\n", sig == SIGINT ? "SIGINT" : "SIGTERM", a.grace.c_str());
  server.stop(*grace);
  served.executor().drain();
  std::fputs("tandem: stopped\n", stderr);
}

void add_serve_command(CLI::App& root) {
  auto a = std::make_shared<serve_args>();
  auto* cmd = root.add_subcommand("serve", "Serve a roster's models over the HTTP API (OpenAI, /infill, Ollama, admin, metrics)");
  cmd->add_option("-c,--config", a->roster, "roster YAML (configs/README.md)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--listen", a->listen, "HOST:PORT to listen on, instead of the roster's server.listen (port 0: any free port)");
  cmd->add_option("-t,--threads", a->threads, "compute threads of the engine (0: all cores)")->capture_default_str();
  cmd->add_option("--http-threads", a->http_threads, "threads running the HTTP sessions")->check(CLI::Range(1, 64))->capture_default_str();
  cmd->add_option("--shutdown-grace", a->grace, "on SIGINT/SIGTERM, how long in-flight requests may still run")->capture_default_str();
  cmd->add_flag("--check", a->check, "validate the roster and print its summary, without opening model files");
  cmd->callback([a] { run_serve(*a); });
}

const command_registrar reg{"serve", &add_serve_command};

}  // namespace
}  // namespace tandem::cli
