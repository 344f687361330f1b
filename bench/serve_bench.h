// `tandem bench serve`: the engine under synthetic load, in process (no HTTP). Aggregate and
// per-stream decode at 1, 4 and 16 concurrent sequences; inter-token latency of 4 streams while
// a long prompt is prefilled, and alone over the same token positions, and that prompt's TTFT
// beside the streams and alone; TTFT of a burst of short high-priority requests on an
// idle engine and while a low-priority entry runs 8 long generations; TTFT of a prompt whose
// prefix is cached against one whose is not; and a high-priority request's TTFT while a
// low-priority model runs a long prompt pass, with interleaving on and off (interleave_bench.h).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <map>
#include <string>

#include "bench/dot_ceiling.h"
#include "bench/interleave_bench.h"
#include "bench/stats.h"

namespace tandem::bench {

struct serve_bench_options {
  std::string model_path;
  std::string high_path;  // the high-priority model of the burst test; empty: a second entry of the model
  int threads = 0;
  int64_t gen = 64;            // tokens per stream in the decode runs
  int reps = 5;                // rounds of the decode runs; each round runs 1, 4 and 16 streams
  int64_t long_prompt = 3000;  // the prompt prefilled during the ITL test
  int64_t prefill_chunk = 16;  // prompt tokens of one sequence per pass
  int64_t max_batch_tokens = 64;
  double itl_budget = 2.0;    // engine_config::itl_budget (with itl_target 0 too: fixed prompt chunks)
  double itl_target_ms = 50;  // engine_config::itl_target
};

struct serve_bench_result {
  std::map<int, double> decode_tok_s;  // aggregate, by concurrency: median over the rounds
  std::map<int, double> per_stream_tok_s;
  std::map<int, summary> decode_rounds;  // aggregate, by concurrency: every round
  // 16 streams over 1, median of the rounds' own ratios: each round runs both within seconds,
  // so a shared machine's slow minute moves both sides of a ratio alike.
  summary decode_16_vs_1;
  double itl_p50_ms_idle = 0, itl_p99_ms_idle = 0;
  double itl_p50_ms_during_prefill = 0, itl_p99_ms_during_prefill = 0;
  double long_prompt_ttft_ms = 0;                              // beside the 4 streams
  double long_prompt_ttft_ms_alone = 0;                        // the same length on an idle engine (no prefix-cache hit)
  int64_t itl_tokens_from = 0, itl_tokens_to = 0;              // the streams' token positions both ITL figures cover
  double burst_ttft_ms_idle = 0, burst_ttft_ms_contended = 0;  // median over the burst
  double prefix_miss_ttft_ms = 0, prefix_hit_ttft_ms = 0;
  interleave_bench_result interleave;
  int64_t interleave_low_prompt = 0;
  int threads = 0;
  // The int8 compute ceiling (bench/dot_ceiling.h) on a pool of the same threads, and the
  // rows per second it allows the model (0 without quantized matrices).
  double dot_ceiling_gmac_s = 0;
  uint64_t int8_macs_per_token = 0;
  double compute_ceiling_tok_s() const { return rows_per_second(dot_ceiling_gmac_s, int8_macs_per_token); }
};

serve_bench_result run_serve_bench(const serve_bench_options& o);
nlohmann::json to_json(const serve_bench_result& r, const serve_bench_options& o);
std::string format_table(const serve_bench_result& r, const serve_bench_options& o);

}  // namespace tandem::bench
