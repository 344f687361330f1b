// Synthetic models: a GGUF file with a real tokenizer and deterministic random weights, in
// the exact layout llama.cpp loads (llama, qwen2, qwen3). Used for tests and benchmarks of
// shapes no downloadable model has.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/weight_type.h"

namespace tandem::models {

struct synth_options {
  std::string arch = "llama";                             // llama | qwen2 | qwen3
  int64_t dim = 0;                                        // embedding_length (D)
  int64_t layers = 0;                                     // block_count
  int64_t heads = 0;                                      // attention.head_count (H)
  int64_t kv_heads = 0;                                   // attention.head_count_kv; 0 means = heads
  int64_t ffn = 0;                                        // feed_forward_length
  int64_t context = 4096;                                 // context_length
  int64_t head_dim = 0;                                   // per-head size; 0 means D / H (qwen2 requires D / H)
  bool tied = false;                                      // no output.weight: the output reuses token_embd
  std::string vocab_path;                                 // GGUF whose tokenizer.* keys are copied (vocab size follows)
  kernels::weight_type type = kernels::weight_type::f16;  // 2-D tensors (1-D are always F32)
  uint64_t seed = 0;
  std::string name;  // general.name; empty means "synth-<arch>"
  int threads = 0;   // generator threads per tensor; 0 means one per core (big tensors)
};

struct synth_report {
  int64_t parameters = 0;          // total elements over all tensors
  uint64_t bytes = 0;              // file size
  double seconds = 0;              // wall time of the whole write
  std::vector<std::string> notes;  // one line per tensor kind that fell back to another type
};

// Weight types synth can write (those quantize_row supports).
bool synth_supports(kernels::weight_type t);

// Writes the model to `out_path` (through a temporary file, renamed when complete). Tensors
// are generated row by row while being written, each row from its own seed, so the output
// is byte-identical for the same options and memory peaks at about one tensor. Bad options
// throw std::invalid_argument naming the option; an unreadable vocab file throws gguf_error
// or std::runtime_error.
synth_report synth_model(const synth_options& opt, const std::string& out_path);

}  // namespace tandem::models
