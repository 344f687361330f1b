// `tandem bench`: prefill, decode and batched-decode throughput of one model on the CPU, and
// decode's weight-read bandwidth against the memory-read ceiling measured in the same
// process (bench/bench_report.h does the work). The table or the JSON object goes to stdout.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "api/router.h"
#include "api/server_context.h"
#include "bench/bench_report.h"
#include "bench/gpu_bench.h"
#include "bench/http_load.h"
#include "bench/serve_bench.h"
#include "bench/spec_bench.h"
#include "bench/grammar_bench.h"
#include "bench/swap_bench.h"
#include "cli/command_registry.h"
#include "configs/roster_loader.h"
#include "kernels/cpu/isa.h"
#include "runtime/served_roster.h"
#include "models/forward.h"

namespace tandem::cli {
namespace {

struct bench_args {
  bench::bench_options opt;
  int read_mib = 0;
  std::string isa = "best";
  bool json = false;
};

// --isa NAME into the path, whether the avx2 path may use AVX-VNNI ("avxvnni": yes) and
// whether the avx512 path may use AMX ("amx": yes; "avx512": no).
void parse_isa(const std::string& name, bench::bench_options& o) {
  using kernels::cpu::isa;
  o.avx_vnni = true;
  o.amx = true;
  if (name == "amx") {
    if (!kernels::cpu::cpu_has_amx())
      throw std::runtime_error("bench: --isa amx: this CPU (or its operating system) offers no AVX-512 with AMX-INT8");
    o.isa = isa::avx512;
    return;
  }
  if (name == "avxvnni") {
    if (!kernels::cpu::cpu_has_avx_vnni()) throw std::runtime_error("bench: --isa avxvnni: this CPU lacks AVX2 with AVX-VNNI");
    o.isa = isa::avx2;
    return;
  }
  for (const isa which : {isa::best, isa::avx512, isa::avx2, isa::scalar}) {
    if (name != kernels::cpu::isa_name(which)) continue;
    if (!kernels::cpu::isa_supported(which))
      throw std::runtime_error("bench: --isa " + name + ": this CPU lacks " + kernels::cpu::isa_requirement(which));
    o.isa = which;
    o.avx_vnni = which != isa::avx2;
    o.amx = which != isa::avx512;
    return;
  }
  throw std::runtime_error("bench: --isa " + name + ": not a path (best, amx, avx512, avxvnni, avx2, scalar)");
}

void run_bench_command(bench_args& a) {
  a.opt.read_buffer_bytes = static_cast<uint64_t>(a.read_mib) << 20;
  parse_isa(a.isa, a.opt);
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
  cmd->add_option("-n,--gen", a->opt.gen, "tokens per stream in the decode runs")
      ->check(CLI::Range(int64_t{2}, int64_t{4096}))
      ->capture_default_str();
  cmd->add_option("-r,--reps", a->opt.reps, "rounds of the decode runs (1, 4 and 16 streams each round; medians reported)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  cmd->add_option("--long-prompt", a->opt.long_prompt, "prompt tokens prefilled during the ITL test")
      ->check(CLI::Range(int64_t{16}, int64_t{16384}))
      ->capture_default_str();
  cmd->add_option("--chunk", a->opt.prefill_chunk, "prompt tokens of one sequence per pass (chunked prefill)")
      ->check(CLI::Range(int64_t{1}, int64_t{4096}))
      ->capture_default_str();
  cmd->add_option("--itl-budget", a->opt.itl_budget, "a pass with prompt rows may take this many times a decode pass, if longer than the target")
      ->check(CLI::Range(0.0, 100.0))
      ->capture_default_str();
  cmd->add_option("--itl-target", a->opt.itl_target_ms, "ms a pass with prompt rows may take beside decoding streams (both 0: fixed chunks)")
      ->check(CLI::Range(0.0, 10000.0))
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

void add_http_command(CLI::App& bench_cmd) {
  struct http_args {
    std::string roster;
    bench::http_load_options opt;
    double seconds = 120, baseline_seconds = 5;
    int threads = 0;
    bool json = false;
  };
  auto a = std::make_shared<http_args>();
  auto* cmd = bench_cmd.add_subcommand("http", "Load-test tandem serve on loopback: concurrent streaming clients, some hanging up mid-stream");
  cmd->add_option("-c,--config", a->roster, "roster YAML to serve (in this process, on an ephemeral port)")->required()->check(CLI::ExistingFile);
  cmd->add_option("--clients", a->opt.clients, "concurrent streaming clients")->check(CLI::Range(1, 1024))->capture_default_str();
  cmd->add_option("--seconds", a->seconds, "how long the load runs")->check(CLI::Range(1.0, 86400.0))->capture_default_str();
  cmd->add_option("--baseline-seconds", a->baseline_seconds, "one client alone first, for the ratio (0: skip)")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  cmd->add_option("--disconnect", a->opt.disconnect_fraction, "fraction of clients that hang up mid-stream")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  cmd->add_option("--max-tokens", a->opt.max_tokens, "tokens per request")->check(CLI::Range(int64_t{1}, int64_t{4096}))->capture_default_str();
  cmd->add_option("--models", a->opt.models, "models to ask, round-robin (default: every model of the roster)");
  cmd->add_option("-t,--threads", a->threads, "compute threads of the engine (0: all cores)")->capture_default_str();
  cmd->add_flag("--json", a->json, "print one JSON object instead of the summary");
  cmd->callback([a] {
    auto roster = configs::load_roster(a->roster);
    roster.server.listen = "127.0.0.1:0";
    // Enough queue for every client: the test is about robustness, not refusals.
    roster.server.limits.max_queue = std::max(roster.server.limits.max_queue, a->opt.clients + 8);
    roster.server.limits.max_connections = std::max(roster.server.limits.max_connections, 2 * a->opt.clients + 8);
    runtime::served_roster served(roster, {.threads = a->threads});
    api::server_context ctx(served, roster.server);
    auto hc = api::http_config_of(roster.server);
    hc.admit = api::make_admission(ctx);
    api::http_server server(hc, api::make_router(ctx));
    if (a->opt.models.empty())
      for (const auto& m : roster.models) a->opt.models.push_back(m.name);
    a->opt.duration = std::chrono::milliseconds(static_cast<int64_t>(a->seconds * 1000));
    a->opt.baseline = std::chrono::milliseconds(static_cast<int64_t>(a->baseline_seconds * 1000));
    const auto r = bench::run_http_load(server.port(), a->opt);
    server.stop(std::chrono::seconds(10));
    served.executor().drain();
    // After the load: no KV held, and the arbiter's books balance.
    int64_t kv_left = 0;
    for (const auto& m : served.models()) kv_left += served.executor().kv_blocks_in_use(m->name());
    std::string integrity = "ok";
    try {
      served.arbiter().check_integrity();
    } catch (const std::exception& e) {
      integrity = e.what();
    }
    auto j = bench::to_json(r);
    j["kv_blocks_in_use_after"] = kv_left;
    j["arbiter_integrity"] = integrity;
    std::string out =
        a->json ? j.dump() + "\n"
                : bench::format_table(r) + "after the load: " + std::to_string(kv_left) + " KV blocks in use, arbiter integrity " + integrity + "\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
    if (r.failed > 0 || kv_left > 0 || integrity != "ok") throw exit_request{1};
  });
}

// Reads a whole text file (a prompt, a prediction) or throws naming it.
std::string read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot read " + path);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void add_spec_command(CLI::App& bench_cmd) {
  struct spec_args {
    bench::spec_bench_options opt;
    std::string prompt_file, prediction_file;
    bool ngram = false, prediction = false, raw = false, json = false;
  };
  auto a = std::make_shared<spec_args>();
  auto* cmd = bench_cmd.add_subcommand("spec", "Measure speculative decoding: plain and speculative greedy decode of the same request, alternating");
  cmd->add_option("-m,--model", a->opt.model_path, "the target's GGUF model file")->required()->check(CLI::ExistingFile);
  auto* draft =
      cmd->add_option("--draft", a->opt.draft_path, "speculate with this draft model (another vocabulary is fine)")->check(CLI::ExistingFile);
  auto* ngram = cmd->add_flag("--ngram", a->ngram, "speculate by n-gram lookup over the sequence's own tokens");
  auto* pred = cmd->add_flag("--prediction", a->prediction,
                             "speculate from a predicted output (OpenAI's prediction): --prediction-file, else the prompt's first ``` block");
  draft->excludes(ngram, pred);
  ngram->excludes(pred);
  cmd->add_option("-p,--prompt-file", a->prompt_file,
                  "the request's text (default: a code-editing request for --prediction, a code-generation one otherwise)")
      ->check(CLI::ExistingFile);
  cmd->add_option("--prediction-file", a->prediction_file, "the predicted output for --prediction")->check(CLI::ExistingFile)->needs(pred);
  cmd->add_flag("--raw", a->raw, "feed the prompt as it is (default: a user message in the model's chat template, when it has one)");
  cmd->add_option("-n,--gen", a->opt.gen, "tokens to generate per run (fewer when the model ends its answer)")
      ->check(CLI::Range(int64_t{2}, models::k_max_context))
      ->capture_default_str();
  cmd->add_option("--draft-max", a->opt.max_draft, "proposals verified in one pass, at most")
      ->check(CLI::Range(int64_t{1}, int64_t{32}))
      ->capture_default_str();
  cmd->add_flag("!--fixed-length", a->opt.cost_aware,
                "with --draft: guess the whole window every pass (default: only as many guesses as pay at the measured acceptance and cost)")
      ->needs(draft);
  cmd->add_option("-r,--reps", a->opt.reps, "timed repetitions of each side (after one untimed warm-up)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_option("-t,--threads", a->opt.threads, "threads (0: all cores)")->check(CLI::Range(0, 1024))->capture_default_str();
  cmd->add_flag("--json", a->json, "print one JSON object instead of the table");
  cmd->callback([a] {
    auto& o = a->opt;
    if (a->ngram + a->prediction + !o.draft_path.empty() != 1)
      throw std::runtime_error("bench spec: give one of --draft FILE, --ngram and --prediction");
    o.method = a->ngram ? bench::spec_bench_method::ngram : a->prediction ? bench::spec_bench_method::prediction : bench::spec_bench_method::draft;
    if (!a->prompt_file.empty()) o.prompt = read_text_file(a->prompt_file);
    if (!a->prediction_file.empty()) o.prediction = read_text_file(a->prediction_file);
    o.chat = !a->raw;
    const auto r = bench::run_spec_bench(o);
    const std::string out = a->json ? bench::to_json(r).dump() + "\n" : bench::format_table(r);
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
  });
}

void add_grammar_command(CLI::App& bench_cmd) {
  struct grammar_args {
    bench::grammar_bench_options opt;
    std::string schema_file, prompt_file;
    bool json = false;
  };
  auto a = std::make_shared<grammar_args>();
  auto* cmd =
      bench_cmd.add_subcommand("grammar", "Measure constrained decoding: the token mask per token, and decode with and without a JSON schema");
  cmd->add_option("-m,--model", a->opt.model_path, "the GGUF model file")->required()->check(CLI::ExistingFile);
  cmd->add_option("--vocab", a->opt.vocab_paths, "more GGUF files whose vocabularies the mask is timed on (repeatable)")->check(CLI::ExistingFile);
  cmd->add_option("--schema", a->schema_file, "a JSON Schema file (default: a built-in record)")->check(CLI::ExistingFile);
  cmd->add_option("-p,--prompt-file", a->prompt_file, "the request's text (default: asks for the built-in record)")->check(CLI::ExistingFile);
  cmd->add_option("-n,--gen", a->opt.gen, "tokens to generate per run, at most")
      ->check(CLI::Range(int64_t{2}, models::k_max_context))
      ->capture_default_str();
  cmd->add_option("-r,--reps", a->opt.reps, "timed repetitions of each side (after one untimed warm-up)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  cmd->add_option("--random-steps", a->opt.random_steps, "steps of the random walk over allowed tokens")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  cmd->add_option("-t,--threads", a->opt.threads, "threads (0: all cores)")->check(CLI::Range(0, 1024))->capture_default_str();
  cmd->add_flag("--json", a->json, "print one JSON object instead of the table");
  cmd->callback([a] {
    auto& o = a->opt;
    if (!a->schema_file.empty()) o.schema = read_text_file(a->schema_file);
    if (!a->prompt_file.empty()) o.prompt = read_text_file(a->prompt_file);
    const auto r = bench::run_grammar_bench(o);
    const std::string out = a->json ? bench::to_json(r).dump() + "\n" : bench::format_table(r);
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
  });
}

void add_gpu_command(CLI::App& bench_cmd) {
  struct gpu_args {
    bench::gpu_bench_options opt;
    std::vector<std::string> from_json;
    bool json = false;
  };
  auto a = std::make_shared<gpu_args>();
  auto* cmd = bench_cmd.add_subcommand(
      "gpu", "Measure one model on the CUDA device: swap-in vs the pinned-copy ceiling, first token, prefill, decode vs the d2d roofline");
  auto* model = cmd->add_option("-m,--model", a->opt.model_path, "GGUF model file")->check(CLI::ExistingFile);
  cmd->add_option("-p,--prompt", a->opt.prompt, "tokens of the first-token and prefill prompt")
      ->check(CLI::Range(int64_t{1}, models::k_max_context))
      ->capture_default_str();
  cmd->add_option("-n,--gen", a->opt.gen, "decode: tokens generated one at a time, greedy")
      ->check(CLI::Range(int64_t{1}, models::k_max_context))
      ->capture_default_str();
  cmd->add_option("-r,--reps", a->opt.reps, "timed repetitions of each figure")->check(CLI::Range(1, 1000))->capture_default_str();
  cmd->add_option("--from-json", a->from_json, "no measuring: the table of saved `bench gpu --json` outputs, side by side")
      ->check(CLI::ExistingFile)
      ->excludes(model);
  cmd->add_flag("--json", a->json, "print one JSON object (with --from-json: an array) instead of the table");
  cmd->callback([a] {
    std::string out;
    if (!a->from_json.empty()) {
      // Tables of runs made elsewhere (scripts/gpu-check's runs): needs no device.
      std::vector<bench::gpu_bench_figures> runs;
      for (const auto& path : a->from_json) {
        std::ifstream in(path);
        const auto j = nlohmann::json::parse(in, nullptr, false);
        if (j.is_discarded()) throw std::runtime_error("bench gpu: " + path + " is not JSON");
        try {
          if (j.is_array())
            for (const auto& e : j) runs.push_back(bench::gpu_figures_from_json(e));
          else
            runs.push_back(bench::gpu_figures_from_json(j));
        } catch (const std::invalid_argument& e) {
          throw std::runtime_error(path + ": " + e.what());
        }
      }
      if (a->json) {
        auto arr = nlohmann::json::array();
        for (const auto& r : runs) arr.push_back(bench::to_json(r));
        out = arr.dump() + "\n";
      } else {
        out = bench::format_gpu_table(runs);
      }
    } else {
      if (a->opt.model_path.empty()) throw std::runtime_error("bench gpu: -m/--model is required (or --from-json FILE...)");
      // No device is an expected outcome on most machines: one line and exit status 2, as for
      // a usage error, so scripts tell it from a failed measurement (1).
      if (const auto why = bench::gpu_bench_unavailable(); !why.empty()) {
        std::fprintf(stderr, "tandem: error: bench gpu needs a CUDA device: %s\n", why.c_str());
        throw exit_request{2};
      }
      const auto r = bench::run_gpu_bench(a->opt);
      out = a->json ? bench::to_json(r).dump() + "\n" : bench::format_gpu_table(r);
    }
    std::fwrite(out.data(), 1, out.size(), stdout);
    std::fflush(stdout);
  });
}

void add_bench_command(CLI::App& root) {
  auto a = std::make_shared<bench_args>();
  auto& p = a->opt.params;
  auto* cmd = root.add_subcommand("bench",
                                  "Measure prefill, decode and batched-decode throughput of a GGUF model (CPU); subcommands measure swaps, serving, "
                                  "HTTP, the GPU and speculation");
  cmd->require_subcommand(0, 1);
  add_swap_command(*cmd);
  add_serve_command(*cmd);
  add_http_command(*cmd);
  add_gpu_command(*cmd);
  add_spec_command(*cmd);
  add_grammar_command(*cmd);
  cmd->add_option("-m,--model", a->opt.model_path, "GGUF model file")->check(CLI::ExistingFile);
  cmd->add_option("-t,--threads", a->opt.threads, "threads (0: all cores)")->check(CLI::Range(0, 1024))->capture_default_str();
  cmd->add_option("-p,--prompt", p.prompt, "prefill: prompt tokens")->check(CLI::Range(int64_t{1}, models::k_max_context))->capture_default_str();
  cmd->add_option("-n,--gen", p.gen, "decode: tokens generated one at a time (and per sequence in batched decode)")
      ->check(CLI::Range(int64_t{1}, models::k_max_context))
      ->capture_default_str();
  cmd->add_option("-b,--batch", p.batch, "batched decode: sequences decoded together")
      ->check(CLI::Range(int64_t{1}, models::k_max_sequences))
      ->capture_default_str();
  cmd->add_option("-d,--depth", p.depth,
                  "prefill, decode and batched decode: tokens already in each sequence's cache (llama-bench's -d; untimed fill)")
      ->check(CLI::Range(int64_t{0}, models::k_max_context))
      ->capture_default_str();
  cmd->add_option("-r,--reps", p.reps, "timed repetitions of each measurement")->check(CLI::Range(1, 1000))->capture_default_str();
  cmd->add_option("--read-mib", a->read_mib, "buffer of the memory-read ceiling in MiB (0: four times the last-level cache, at least 256)")
      ->check(CLI::Range(0, 1 << 16))
      ->capture_default_str();
  cmd->add_option("--isa", a->isa,
                  "kernel path for the whole run, model load included: best, amx, avx512, avxvnni, avx2 or scalar (amx: AVX-512 with AMX tiles for "
                  "prefill, Sapphire Rapids and later; avx512: without them; avxvnni: AVX2 with AVX-VNNI, as Intel Alder Lake and later without "
                  "AVX-512; avx2: without it)")
      ->check(CLI::IsMember({"best", "amx", "avx512", "avxvnni", "avx2", "scalar"}))
      ->capture_default_str();
  // Every phase computes as the engine does (`tandem serve`) unless asked for llama.cpp's
  // arithmetic, which `tandem run` keeps.
  auto* exact_prompt = cmd->add_flag("!--exact-prompt", p.fast_prompt_attention,
                                     "prefill by llama.cpp's arithmetic (f16 flash attention, expf, ggml's Q4_1/Q5_1 order), as `tandem run` "
                                     "(default: the server's: tiled attention, SwiGLU's vector e^x, Q4_1/Q5_1 tile order)");
  cmd->add_flag("!--exact-decode", p.fast_decode_attention,
                "single-sequence decode by llama.cpp's arithmetic, as `tandem run` (default: the server's)");
  cmd->add_flag("!--exact-batched", p.fast_batched_attention, "batched decode by llama.cpp's arithmetic (default: the server's)");
  cmd->add_flag("--compare-prompt", p.compare_prompt,
                "also prefill by llama.cpp's arithmetic beside the server's, alternating repetitions, and report the ratio")
      ->excludes(exact_prompt);
  // The default now; still accepted so that commands written for the old default run.
  cmd->add_flag("--fast-prompt", p.fast_prompt_attention, "prefill by the server's arithmetic (the default)")->excludes(exact_prompt)->group("");
  cmd->add_flag("--compare-layer-teams", p.compare_layer_teams,
                "decode with a pool job per step and also with one team job per layer (the default), alternating repetitions, and report the ratio");
  cmd->add_flag("--json", a->json, "print one JSON object instead of the table");
  cmd->callback([a, cmd] {
    if (cmd->got_subcommand("swap") || cmd->got_subcommand("serve") || cmd->got_subcommand("http") || cmd->got_subcommand("gpu") ||
        cmd->got_subcommand("spec") || cmd->got_subcommand("grammar"))
      return;
    if (a->opt.model_path.empty()) throw std::runtime_error("bench: -m/--model is required");
    run_bench_command(*a);
  });
}

const command_registrar reg{"bench", &add_bench_command};

}  // namespace
}  // namespace tandem::cli
