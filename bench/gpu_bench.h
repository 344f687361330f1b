// `tandem bench gpu`: one model on a CUDA device, each figure beside the ceiling it is read
// against. Host -> device: copies of the model's segments from the CUDA backend's pinned host
// tier (as the arbiter issues them) and the arbiter's whole swap-in, against one plain copy of
// the same bytes. Compute: the first token of a prompt while the segments still land
// (pipelined) and after they all have (sequential); prefill and greedy decode on a resident
// model; decode's weight reads against the device-to-device copy bandwidth (the roofline of
// a pass that streams its weights once per token).
//
// The figures, their JSON form and the tables need no CUDA; run_gpu_bench does, and throws
// where the build or the machine has none. scripts/gpu-check runs this on the ~1B synthetic
// models (gpu_check_shape) and prints their figures side by side (docs/gpu.md).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace tandem::bench {

struct gpu_bench_options {
  std::string model_path;
  int64_t prompt = 512;  // tokens of the first-token and prefill prompt
  int64_t gen = 64;      // decode tokens, one per pass, greedy
  int reps = 3;          // timed repetitions of each figure (after one untimed warm-up)
  uint64_t seed = 1;     // prompt token ids (bench_tokens)
};

// One run. Every figure is the median of `reps` repetitions, except the two ceilings
// (memcpy_ceiling_gb_s, d2d_gb_s), which are the best of them: a ceiling is what the hardware
// can do, not what it usually does. GB/s are 1e9 bytes per second.
struct gpu_bench_figures {
  std::string device;                   // the CUDA device's name, e.g. "NVIDIA H200"
  std::string model;                    // the GGUF path
  std::string type;                     // the weight type holding most bytes, e.g. "Q4_K"
  uint64_t model_bytes = 0;             // the segments' bytes: what a swap-in moves
  uint64_t decode_bytes_per_token = 0;  // weight bytes one decode step reads (decode_weight_bytes)
  int segments = 0;
  int64_t prompt = 0;
  int64_t gen = 0;
  int reps = 0;
  double pinned_h2d_gb_s = 0;            // backend copies, one per segment, each waited for (as the arbiter's loader)
  double memcpy_ceiling_gb_s = 0;        // one copy of model_bytes from pinned memory, timed by the device
  double swap_in_s = 0;                  // arbiter load of every segment from the host tier, to the last landing
  double swap_in_gb_s = 0;               // model_bytes / swap_in_s
  double first_token_ms_pipelined = 0;   // device copies evicted; load started and prompt run at once
  double first_token_ms_sequential = 0;  // the same, the load waited for before the prompt
  double prefill_tok_s = 0;              // resident: prompt / seconds of one eval of the whole prompt
  double decode_tok_s = 0;               // resident: gen / seconds of gen one-token evals, greedy on the CPU
  double decode_gb_s = 0;                // decode_bytes_per_token * decode_tok_s
  double d2d_gb_s = 0;                   // device -> device copy: 2 * bytes / seconds (read and write)
  bool decode_cuda_graphs = false;       // decode replayed CUDA graphs (not turned off, no capture refused)

  // Medians divided (0 when the divisor is 0).
  double swap_in_vs_ceiling() const;       // swap_in_gb_s / memcpy_ceiling_gb_s
  double decode_vs_roofline() const;       // decode_gb_s / d2d_gb_s
  double pipelined_vs_sequential() const;  // first_token_ms_pipelined / first_token_ms_sequential

  bool operator==(const gpu_bench_figures&) const = default;
};

// The targets docs/gpu.md states: swap-in at least this share of the pinned-copy ceiling;
// Q4_K decode at least this share of the device-bandwidth roofline (other types: no target).
inline constexpr double k_swap_in_target = 0.85;
inline constexpr double k_q4k_decode_target = 0.60;

// The targets a run misses, by name ("swap-in", "decode"); empty when it meets them all.
std::vector<std::string> gpu_targets_missed(const gpu_bench_figures& f);

// Empty when run_gpu_bench can run here; otherwise why not ("built without CUDA", or the
// driver's reason no device answered). Never throws.
std::string gpu_bench_unavailable();

// Loads the model (file layout, as the CUDA kernels read it) and measures every figure.
// Throws std::runtime_error with gpu_bench_unavailable()'s reason when there is no device
// (always, in a build without CUDA), std::invalid_argument for prompt, gen or reps < 1, and
// what loading the model or the forward pass throws.
gpu_bench_figures run_gpu_bench(const gpu_bench_options& o);

// One flat object: every field under its own name, and the three ratios under their
// function names.
nlohmann::json to_json(const gpu_bench_figures& f);
// The inverse, for tables assembled from saved runs (the ratios are recomputed, not read).
// Throws std::invalid_argument naming the first field missing or of the wrong kind.
gpu_bench_figures gpu_figures_from_json(const nlohmann::json& j);

// A table with one row per figure and one column per run (headed by the model file's name
// without directory or .gguf), then the targets each run meets or misses.
std::string format_gpu_table(std::span<const gpu_bench_figures> runs);
std::string format_gpu_table(const gpu_bench_figures& f);

// The shape of a Llama-family model, and its parameter count (every tensor's elements:
// embedding, output head unless tied, per layer q/k/v/o, gate/up/down and two norms, the
// final norm). Used to keep scripts/gpu-check's synthetic model near 1B parameters.
struct llama_shape {
  int64_t dim = 0, layers = 0, heads = 0, kv_heads = 0, ffn = 0, vocab = 0;
  bool tied = false;
};
uint64_t llama_parameters(const llama_shape& s);

}  // namespace tandem::bench
