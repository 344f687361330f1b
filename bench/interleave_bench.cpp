#include "bench/interleave_bench.h"

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "bench/model_bench.h"
#include "configs/roster_loader.h"
#include "runtime/served_roster.h"

namespace tandem::bench {
namespace {

using clock_type = std::chrono::steady_clock;

double median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

runtime::generation_params one_token() {
  runtime::generation_params g;
  g.max_tokens = 1;
  g.sampling.temperature = 0;
  g.stop_at_eog = false;
  return g;
}

std::string roster_yaml(const interleave_bench_options& o, bool interleave) {
  const int64_t ctx = o.low_prompt + 64;
  const std::string high = o.high_path.empty() ? o.low_path : o.high_path;
  // Both models on the device for good: only interleaving differs between the two runs.
  return "devices:\n  - backend: cpu\n    vram: 8GiB\n    host: 8GiB\n"
         "models:\n"
         "  - name: low\n    path: \"" +
         o.low_path +
         "\"\n    priority: 0\n    preload: device\n    keep_alive: -1\n"
         "    context: " +
         std::to_string(ctx) +
         "\n    max_sequences: 1\n"
         "  - name: high\n    path: \"" +
         high +
         "\"\n    priority: 100\n    preload: device\n    keep_alive: -1\n"
         "    context: " +
         std::to_string(std::max<int64_t>(o.high_prompt + 64, 128)) +
         "\n    max_sequences: 1\n"
         "policy:\n  prefetch: false\n  idle_grace: 1h\n  itl_target: 0\n  itl_budget: 0\n  interleave: " +
         (interleave ? "true" : "false") + "\n";
}

}  // namespace

interleave_bench_result run_interleave_bench(const interleave_bench_options& o) {
  interleave_bench_result out;
  for (const bool interleave : {true, false}) {
    const auto roster = configs::parse_roster(roster_yaml(o, interleave), "interleave-bench", ".");
    runtime::served_roster s(roster, {.threads = o.threads, .max_batch_tokens = o.low_prompt, .prefill_chunk = o.low_prompt});
    while (!s.ready()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    auto& e = s.executor();
    const int64_t vocab = s.models().front()->model->config().n_vocab;
    const int64_t high_vocab = s.models().back()->model->config().n_vocab;
    // Distinct prompts every time: no prefix-cache hit may shorten a pass.
    const auto ids = bench_tokens(std::min(vocab, high_vocab), (o.low_prompt + o.high_prompt) * (o.reps + 1), 11);
    auto prompt = [&](int64_t at, int64_t n) { return std::vector<int32_t>(ids.begin() + at, ids.begin() + at + n); };
    e.submit({"high", prompt(0, o.high_prompt), one_token()})->wait();  // warm-up
    std::vector<double> ttft, low_ms;
    for (int rep = 0; rep < o.reps; ++rep) {
      const int64_t at = (rep + 1) * (o.low_prompt + o.high_prompt);
      const auto t0 = clock_type::now();
      auto low = e.submit({"low", prompt(at, o.low_prompt), one_token()});
      // The low pass has begun once its request runs; a little later it is in its layers.
      while (e.stats("low").running == 0 && low->finished() == runtime::finish_reason::none) std::this_thread::yield();
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const auto t1 = clock_type::now();
      auto high = e.submit({"high", prompt(at + o.low_prompt, o.high_prompt), one_token()});
      int32_t tok = 0;
      high->next(&tok);
      ttft.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - t1).count());
      low->next(&tok);
      low_ms.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - t0).count());
      high->wait();
      low->wait();
    }
    e.drain();
    if (interleave) {
      out.high_ttft_ms_interleaved = median(ttft);
      out.interleaved_passes = e.stats("high").interleaved_passes;
    } else {
      out.high_ttft_ms_waiting = median(ttft);
      out.low_pass_ms = median(low_ms);
    }
  }
  return out;
}

}  // namespace tandem::bench
