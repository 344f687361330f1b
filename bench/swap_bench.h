// `tandem bench swap`: what a swap-in costs. One model on the CPU backend (the device tier an
// arena in RAM, copies on the backend's copy thread, optionally throttled to a simulated
// link): disk -> host staging time, host -> device swap-in time and GB/s against a memcpy of
// the same bytes measured in the same process, and the time to the first token of a prompt
// right after a swap-in, with the forward pass started while the segments land (pipelined)
// and after they all have (sequential), beside the same prompt on a resident model.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "bench/stats.h"

namespace tandem::bench {

struct swap_bench_options {
  std::string model_path;
  int threads = 0;       // 0: all cores
  int64_t prompt = 512;  // tokens of the first-token prompt
  int reps = 3;
  double link_gbps = 0;  // > 0: throttle host <-> device copies (simulated)
  uint64_t seed = 1;
};

struct swap_bench_result {
  std::string model_path;
  std::string backend;
  double link_gbps = 0;
  uint64_t bytes = 0;  // the model's segments in device form (what a swap-in moves)
  int segments = 0;
  int threads = 0;
  int64_t prompt = 0;
  int reps = 0;
  summary stage_s;    // disk -> host (reading the file, packing)
  summary swap_in_s;  // host -> device
  summary swap_in_gb_s;
  summary copy_ceiling_gb_s;  // memcpy of `bytes` between two warm buffers, one thread
  summary first_token_ms_resident;
  summary first_token_ms_pipelined;
  summary first_token_ms_sequential;
  // Per repetition, pipelined (sequential) minus the resident run of the same repetition: a
  // paired difference, so the drift of a shared machine between repetitions cancels.
  summary swap_penalty_ms;
  summary sequential_penalty_ms;

  double swap_in_vs_ceiling() const;       // medians
  double pipelined_vs_sequential() const;  // medians
};

// Throws what loading the model throws, and std::runtime_error when the machine cannot hold
// two copies of the model (device and host tiers) plus the copy-ceiling buffers.
swap_bench_result run_swap_bench(const swap_bench_options& o);

// One flat object: bytes, swap_in_gb_s, copy_ceiling_gb_s, first_token_ms_pipelined,
// first_token_ms_sequential (medians) and the other figures, "<name>_min" / "<name>_max" beside
// each, the ratios and the settings.
nlohmann::json to_json(const swap_bench_result& r);
std::string format_table(const swap_bench_result& r);

}  // namespace tandem::bench
