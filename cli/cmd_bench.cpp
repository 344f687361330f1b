// `tandem bench`: prefill, decode and batched-decode throughput of one model on the CPU, and
// decode's weight-read bandwidth against the memory-read ceiling measured in the same
// process (bench/bench_report.h does the work). The table or the JSON object goes to stdout.
#include <cstdio>
#include <memory>
#include <stdexcept>

#include "bench/bench_report.h"
#include "bench/serve_bench.h"
#include "bench/swap_bench.h"
#include "cli/command_registry.h"
#include "models/forward.h"

namespace tandem::cli {
namespace {

struct bench_args {
  bench::bench_options opt;
  int read_mib = 0;
  bool json = false;
};

void run_bench_command(bench_args& a) {
  a.opt.read_buffer_bytes = static_cast<uint64_t>(a.read_mib) << 20;
  const auto r = bench::run_bench(a.opt);
  const std::string out = a.json ? bench::to_json(r).dump() + "\n" : bench::format_table(r);
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
}

struct swap_args {
  bench::swap_bench_options opt;
  bool json = false;
};

void add_swap_command(CLI::App& bench_cmd) {
  auto a = std::make_shared<swap_args>();
  auto* cmd = bench_cmd.add_subcommand("swap", "Measure a swap-in: staging, host->device copy vs memcpy, first token after it (CPU backend)");
  cmd->add_option("-m,--model", a->opt.model_path, "GGUF model file")->required()->check(CLI::ExistingFile);
  cmd->add_option("-t,--threads", a->opt.threads, "threads (0: all cores)")->check(CLI::Range(0, 1024))->capture_default_str();
  cmd->add_option("-p,--prompt", a->opt.prompt, "tokens of the first-token prompt")
      ->check(CLI::Range(int64_t{1}, models::k_max_context))
      ->capture_default_str();
  cmd->add_option("-r,--reps", a->opt.reps, "timed repetitions")->check(CLI::Range(1, 1000))->capture_default_str();
  cmd->add_option("--link-gbps", a->opt.link_gbps, "throttle host<->device copies to this many GB/s (simulated PCIe; 0: off)")
      ->check(CLI::Range(0.0, 10000.0))
      ->capture_default_str();
  cmd->add_flag("--json", a->json, "print one JSON object instead of the table");
  cmd->callback([a] {
    const auto r = bench::run_swap_bench(a->opt);
    const std::string out = a->json ? bench::to_json(r).dump() + "\n" : bench::format_table(r);
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
  });
}

void add_serve_command(CLI::App& bench_cmd) {
  struct serve_args {
    bench::serve_bench_options opt;
    bool json = false;
  };
  auto a = std::make_shared<serve_args>();
  auto* cmd = bench_cmd.add_subcommand("serve", "Measure the engine under load: concurrency, ITL during prefill, priority bursts, prefix cache");
  cmd->add_option("-m,--model", a->opt.model_path, "GGUF model file")->required()->check(CLI::ExistingFile);
  cmd->add_option("--high", a->opt.high_path, "the high-priority model of the burst test (default: a second entry of --model)")
      ->check(CLI::ExistingFile);
  cmd->add_option("-t,--threads", a->opt.threads, "threads (0: all cores)")->check(CLI::Range(0, 1024))->capture_default_str();
  cmd->add_option("-n,--gen", a->opt.gen, "tokens per stream in the decode runs")->check(CLI::Range(int64_t{2}, int64_t{4096}))->capture_default_str();
  cmd->add_option("--long-prompt", a->opt.long_prompt, "prompt tokens prefilled during the ITL test")
      ->check(CLI::Range(int64_t{16}, int64_t{16384}))
      ->capture_default_str();
  cmd->add_option("--chunk", a->opt.prefill_chunk, "prompt tokens of one sequence per pass (chunked prefill)")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}))
      ->capture_default_str();
  cmd->add_option("--itl-budget", a->opt.itl_budget, "a pass with prompt rows may take this many times a decode pass (0: fixed chunks)")
      ->check(CLI::Range(0.0, 100.0))
      ->capture_default_str();
  cmd->add_option("--batch-tokens", a->opt.max_batch_tokens, "rows per pass")->check(CLI::Range(int64_t{1}, int64_t{4096}))->capture_default_str();
  cmd->add_flag("--json", a->json, "print one JSON object instead of the table");
  cmd->callback([a] {
    const auto r = bench::run_serve_bench(a->opt);
    const std::string out = a->json ? bench::to_json(r, a->opt).dump() + "\n" : bench::format_table(r, a->opt);
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
  });
}

void add_bench_command(CLI::App& root) {
  auto a = std::make_shared<bench_args>();
  auto& p = a->opt.params;
  auto* cmd = root.add_subcommand("bench", "Measure prefill, decode and batched-decode throughput of a GGUF model (CPU); `bench swap`: a swap-in");
  cmd->require_subcommand(0, 1);
  add_swap_command(*cmd);
  add_serve_command(*cmd);
  cmd->add_option("-m,--model", a->opt.model_path, "GGUF model file")->check(CLI::ExistingFile);
  cmd->add_option("-t,--threads", a->opt.threads, "threads (0: all cores)")->check(CLI::Range(0, 1024))->capture_default_str();
  cmd->add_option("-p,--prompt", p.prompt, "prefill: prompt tokens")
      ->check(CLI::Range(int64_t{1}, models::k_max_context))
      ->capture_default_str();
  cmd->add_option("-n,--gen", p.gen, "decode: tokens generated one at a time (and per sequence in batched decode)")
      ->check(CLI::Range(int64_t{1}, models::k_max_context))
      ->capture_default_str();
  cmd->add_option("-b,--batch", p.batch, "batched decode: sequences decoded together")
      ->check(CLI::Range(int64_t{1}, models::k_max_sequences))
      ->capture_default_str();
  cmd->add_option("-r,--reps", p.reps, "timed repetitions of each measurement")->check(CLI::Range(1, 1000))->capture_default_str();
  cmd->add_option("--read-mib", a->read_mib, "buffer of the memory-read ceiling in MiB (0: four times the last-level cache, at least 256)")
      ->check(CLI::Range(0, 1 << 16))
      ->capture_default_str();
  cmd->add_flag("--fast-prompt", p.fast_prompt_attention,
                "prefill attention by the prompt kernel, as the server computes prompts (default: llama.cpp's f16 arithmetic, as `tandem run`)");
  cmd->add_flag("--json", a->json, "print one JSON object instead of the table");
  cmd->callback([a, cmd] {
    if (cmd->got_subcommand("swap") || cmd->got_subcommand("serve")) return;
    if (a->opt.model_path.empty()) throw std::runtime_error("bench: -m/--model is required");
    run_bench_command(*a);
  });
}

const command_registrar reg{"bench", &add_bench_command};

}  // namespace
}  // namespace tandem::cli
