// Execution state of one sequence on a Llama-family model: KV cache, scratch, and the forward
// pass (llama, qwen2, qwen3 differ only in data-driven details: biases, q/k norms, RoPE pairing).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_pool.h"
#include "models/model.h"

namespace tandem::models {

// Largest context a forward_context accepts (as llama.cpp's largest trained contexts).
inline constexpr int64_t k_max_context = int64_t{1} << 24;

// Bytes of K and V cache for n_ctx positions of every layer.
uint64_t kv_cache_bytes(const model_config& c, int64_t n_ctx, kernels::cpu::kv_type kv);

struct context_params {
  int64_t n_ctx = 0;                               // 0: the model's training context
  kernels::cpu::kv_type kv = kernels::cpu::kv_type::f16;  // llama.cpp's default cache type
  int64_t max_batch = 512;                         // prompt tokens per forward pass (scratch rows)
};

// Owns the KV cache and scratch of one sequence, sized once at construction; eval() allocates
// nothing. The model must outlive the context. The constructor throws std::invalid_argument
// for a context size outside [1, k_max_context] and std::runtime_error when the cache would
// not fit in the machine's memory.
class forward_context {
 public:
  forward_context(const model& m, const context_params& p, kernels::cpu::thread_pool* pool);

  // Runs `tokens` at positions pos() .. pos()+n-1 (in chunks of max_batch) and appends them to
  // the cache. Afterwards logits() holds the last token's logits; with all_logits, every
  // token's logits ([n][n_vocab], from all_logits_rows()). Throws std::invalid_argument before
  // doing any work when a token id is out of range or the context would overflow.
  void eval(std::span<const int32_t> tokens, bool all_logits = false);

  std::span<const float> logits() const { return {logits_.data() + (n_logit_rows_ - 1) * n_vocab_, static_cast<size_t>(n_vocab_)}; }
  std::span<const float> all_logits_rows() const { return {logits_.data(), static_cast<size_t>(n_logit_rows_ * n_vocab_)}; }
  int64_t pos() const { return pos_; }
  int64_t n_ctx() const { return n_ctx_; }
  // Forgets the sequence (the cache is overwritten by the next eval).
  void reset() { pos_ = 0; }
  // Rolls back to an earlier position (e.g. to re-run the last prompt token).
  void truncate(int64_t pos);

 private:
  // all_logits: where to write every row's logits, or null to keep only the last row's.
  void eval_chunk(const int32_t* tokens, int64_t n, float* all_logits);

  const model& model_;
  kernels::cpu::thread_pool* pool_;
  kernels::cpu::kv_type kv_type_;
  kernels::cpu::rope_params rope_;
  int64_t n_ctx_;
  int64_t max_batch_;
  int64_t n_vocab_;
  int64_t pos_ = 0;
  int64_t n_logit_rows_ = 1;

  // KV cache per layer, [n_ctx][n_head_kv][head_dim] of kv_type_ elements.
  std::vector<std::vector<std::byte>> k_cache_, v_cache_;
  // Scratch, max_batch rows each: x residual stream, xb normed input / branch output,
  // q/k/v projections, attn attention output, ff_gate/ff_up feed-forward hidden.
  std::vector<float> x_, xb_, q_, k_, v_, attn_, ff_gate_, ff_up_;
  std::vector<float> logits_;
};

}  // namespace tandem::models
