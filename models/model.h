// A loaded Llama-family model: the GGUF file, its config, and views of its weights.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kernels/cpu/packed.h"
#include "kernels/weight_type.h"
#include "memory/huge_buffer.h"
#include "models/gguf_reader.h"
#include "models/model_config.h"

namespace tandem::models {

class tokenizer;
struct weight_plan;

// A weight matrix as the kernels see it: `rows` rows of `cols` elements of `type`. With the
// rows layout, contiguous GGUF rows (ne = {cols, rows}) in the mapped file; with the packed
// layout, 16-row panels owned by model_weights::packed (kernels/cpu/packed.h).
struct weight_view {
  const void* data = nullptr;
  kernels::weight_type type = kernels::weight_type::f32;
  int64_t rows = 0;
  int64_t cols = 0;
  kernels::cpu::weight_layout layout = kernels::cpu::weight_layout::rows;
};

// Row `row` of a weight matrix as floats, whatever its layout (the token embedding lookup).
void dequantize_weight_row(const weight_view& w, int64_t row, float* out);

// How a model is loaded.
struct load_options {
  // Repack matrices into 16-row panels where the kernels gain from it
  // (kernels::cpu::pack_at_load); off keeps every matrix in its file layout.
  bool pack_weights = true;
  // The model holds its weights itself (packed ones in its own buffer, the others viewed in
  // the file mapping). Off: weights() views only the file, unpacked, and the forward pass
  // reads the device copies of the model's segments (weight_plan.h) that a memory arbiter
  // holds (arbiter_residency.h); packing then happens when a segment is filled.
  bool own_weights = true;
};

struct layer_weights {
  const float* attn_norm = nullptr;  // [n_embd]
  weight_view wq;                    // [q_dim][n_embd]
  weight_view wk;                    // [kv_dim][n_embd]
  weight_view wv;                    // [kv_dim][n_embd]
  weight_view wo;                    // [n_embd][q_dim]
  const float* bq = nullptr;         // [q_dim]  qwen2 only
  const float* bk = nullptr;         // [kv_dim] qwen2 only
  const float* bv = nullptr;         // [kv_dim] qwen2 only
  const float* q_norm = nullptr;     // [head_dim] qwen3 only
  const float* k_norm = nullptr;     // [head_dim] qwen3 only
  const float* ffn_norm = nullptr;   // [n_embd]
  weight_view w_gate;                // [n_ff][n_embd]
  weight_view w_up;                  // [n_ff][n_embd]
  weight_view w_down;                // [n_embd][n_ff]
};

struct model_weights {
  weight_view token_embd;              // [n_vocab][n_embd]
  const float* output_norm = nullptr;  // [n_embd]
  weight_view output;                  // [n_vocab][n_embd]; token_embd when tied
  const float* rope_freqs = nullptr;   // [n_rot/2] llama3 frequency divisors, or null
  std::vector<layer_weights> layers;
  // 1-D tensors (norms, biases, rope_freqs) converted to F32 at load; the pointers above
  // point into these buffers. Matrices stay in the file mapping unless packed.
  std::vector<std::vector<float>> owned;
  // Packed matrices (load_options::pack_weights), one after another in one huge-page buffer;
  // packed views point into it.
  memory::huge_buffer packed;
};

class model {
 public:
  // Opens, validates and binds the file. Throws gguf_error / runtime_error naming the file,
  // key or tensor; a matrix of a type tandem cannot compute is an error naming the tensor, so
  // is a 1-D tensor (norm, bias, rope_freqs) that is not F32, F16 or BF16, and rope_freqs
  // holding a divisor that is not finite and positive.
  explicit model(const std::string& path, const load_options& options = {});
  ~model();
  model(const model&) = delete;
  model& operator=(const model&) = delete;

  const gguf_file& file() const { return file_; }
  const model_config& config() const { return config_; }
  const model_weights& weights() const { return weights_; }
  // The model's segments and where each tensor sits in them (weight_plan.h).
  const weight_plan& plan() const { return *plan_; }
  const load_options& options() const { return options_; }
  // Bytes of all tensor data (what the weights occupy in memory).
  uint64_t weight_bytes() const;

 private:
  gguf_file file_;
  model_config config_;
  load_options options_;
  model_weights weights_;
  std::unique_ptr<weight_plan> plan_;
};

// Throws gguf_error naming `path` and both sizes unless the tokenizer has exactly the model's
// n_vocab tokens (llama.cpp requires the same): fewer would let the model emit ids the
// tokenizer cannot print, more would let a prompt hold ids outside the embedding table.
void check_tokenizer_matches(const tokenizer& tok, const model_config& c, const std::string& path);

}  // namespace tandem::models
