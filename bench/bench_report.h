// `tandem bench` as a library: load a model, measure its throughput and the memory-read
// ceiling with one thread pool, and render the result as a table or one JSON object. The
// command in cli/ only parses arguments and prints.
#pragma once

#include <nlohmann/json.hpp>

#include <string>

#include "bench/dot_ceiling.h"
#include "bench/model_bench.h"
#include "bench/read_ceiling.h"
#include "kernels/cpu/isa.h"

namespace tandem::bench {

struct bench_options {
  std::string model_path;
  int threads = 0;  // 0: kernels::cpu::default_thread_count()
  // The kernels' instruction-set path for the whole run, model load included: a narrower one
  // measures what CPUs without AVX-512 get; best leaves the process's setting as it is
  // (automatic unless something forced a path). The read and dot ceilings take the same path.
  // The process's setting is put back when run_bench returns.
  kernels::cpu::isa isa = kernels::cpu::isa::best;
  // With a forced path: whether the avx2 path may use AVX-VNNI where the CPU has it (off: what
  // AVX2 CPUs without it get).
  bool avx_vnni = true;
  // With a forced path: whether the avx512 path may use AMX where the CPU has it (off: what
  // AVX-512 CPUs without it get).
  bool amx = true;
  model_bench_params params;
  uint64_t read_buffer_bytes = 0;  // 0: default_read_buffer_bytes()
};

struct bench_report {
  std::string model_path;
  std::string arch;           // "llama", "qwen2", ...
  std::string type;           // main_weight_type, e.g. "Q4_K"
  uint64_t weight_bytes = 0;  // all tensor data in the file
  int threads = 0;
  std::string isa;  // kernel path taken: scalar, avx2, avxvnni, avx512, amx
  model_bench_params params;
  model_bench_result result;
  // Measured with the same pool: per decode repetition the mean of its passes (one every
  // k_ceiling_pause_tokens tokens within it and one right after it; with
  // compare_layer_teams only the one after), then more after the model phases up to at least 3.
  read_ceiling_result ceiling;
  // decode_gb_s[i] / repetition i's ceiling: on a shared machine the bandwidth available
  // moves within a second, so only figures taken across the same time compare.
  std::vector<double> decode_vs_ceiling_samples;
  dot_ceiling_result dots;  // likewise, after the read ceiling

  // Medians divided (0 when the divisor is 0): batched aggregate over one sequence decoded in
  // the same context and arithmetic (like for like), batched aggregate over decode_tok_s
  // (a one-sequence context).
  double batched_vs_single() const;
  double batched_vs_decode() const;
  // Decode GB/s over the read ceiling: the median of decode_vs_ceiling_samples (medians
  // divided when there are none).
  double decode_vs_ceiling() const;
  // compare_layer_teams: decode_layer_teams_tok_s[i] / decode_tok_s[i], repetition by
  // repetition, and their median (0 without the comparison).
  std::vector<double> layer_teams_vs_step_jobs_samples() const;
  double layer_teams_vs_step_jobs() const;
  // compare_prompt: prefill_tok_s[i] / prefill_exact_tok_s[i], repetition by repetition,
  // and their median (0 without the comparison).
  std::vector<double> prefill_server_vs_exact_samples() const;
  double prefill_server_vs_exact() const;
  // Rows per second the int8 dot ceiling allows: dots median / int8 MACs per row (0 for a
  // model without quantized matrices), and batched decode's aggregate over it.
  double compute_ceiling_tok_s() const;
  double batched_vs_compute_ceiling() const;
};

// Tokens of a timed decode between two passes of the read ceiling (run_bench): at the 250M
// models' ~150-400 tok/s, a pass every 0.1-0.2 s (this VM's default buffer, 1,280 MiB, takes ~40 ms
// at ~33 GB/s).
inline constexpr int64_t k_ceiling_pause_tokens = 32;

// Loads the model, runs run_model_bench, measure_read_ceiling and measure_dot_ceiling (with
// at least 3 repetitions, they being cheap) on one pool of `threads`. Throws what they throw, and
// the model loader's errors naming the file.
bench_report run_bench(const bench_options& o);

// One flat object: medians under the names (prefill_tok_s, decode_tok_s,
// batched_decode_tok_s, decode_gb_s, read_ceiling_gb_s, dot_ceiling_gmac_s) and
// decode_as_batched_tok_s,
// "<name>_min" / "<name>_max" and "<name>_samples" beside each, the ratios
// (batched_vs_single, batched_vs_decode, decode_vs_ceiling with decode_vs_ceiling_samples,
// compute_ceiling_tok_s, batched_vs_compute_ceiling),
// with --compare-layer-teams also decode_layer_teams_tok_s and layer_teams_vs_step_jobs
// (with its _samples), with --compare-prompt also prefill_exact_tok_s and
// prefill_server_vs_exact (with its _samples), and the run's settings (model, arch, type, threads, isa, prompt, gen, batch, reps,
// decode_bytes_per_token, int8_macs_per_token, read_buffer_bytes, weight_bytes).
nlohmann::json to_json(const bench_report& r);

// A small human-readable table: one line per figure with median and [min .. max].
std::string format_table(const bench_report& r);

}  // namespace tandem::bench
