// The engine's interleaving measured (part of `tandem bench serve`): a high-priority request
// submitted while a low-priority model runs one long prompt pass, on a roster engine with
// policy.interleave on and then off. With it, the request's passes run between the low pass's
// layers; without, it waits for the pass to end. Both models stay on the device (CPU backend).
#pragma once

#include <cstdint>
#include <string>

namespace tandem::bench {

struct interleave_bench_options {
  std::string low_path, high_path;  // high empty: the low model again, as a second entry
  int threads = 0;
  int64_t low_prompt = 1024;  // rows of the low pass (one pass: chunk and batch that large)
  int64_t high_prompt = 16;
  int reps = 3;
};

struct interleave_bench_result {
  double high_ttft_ms_interleaved = 0, high_ttft_ms_waiting = 0;  // medians over reps
  double low_pass_ms = 0;                                         // the low prompt's time to first token, interleave off (median)
  int64_t interleaved_passes = 0;                                 // the high model's passes run inside low passes (interleave on)
};

// Throws what served_roster throws for models that cannot be opened or placed.
interleave_bench_result run_interleave_bench(const interleave_bench_options& o);

}  // namespace tandem::bench
