// Element-wise and attention ops of a Llama-family forward pass (F32 activations).
#pragma once

#include <cstdint>

#include "kernels/cpu/thread_pool.h"

namespace tandem::kernels::cpu {

// out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i]; w may be null (no scale). out may equal x.
void rms_norm(const float* x, const float* w, float* out, int64_t n, float eps);

enum class rope_pairing {
  adjacent,  // rotate (x[2i], x[2i+1]): llama, mistral (ggml "NORM")
  neox,      // rotate (x[i], x[i + n_rot/2]): qwen2, qwen3 (ggml "NEOX", HF rotate_half)
};

// Everything RoPE needs besides the data; built once from the model config.
struct rope_params {
  int n_rot = 0;                       // rotated dims per head (<= head_dim; rest pass through)
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;             // 1/linear factor (linear and yarn scaling)
  rope_pairing pairing = rope_pairing::adjacent;
  const float* freq_factors = nullptr; // llama3 rope_freqs: n_rot/2 divisors of theta_i, or null
  // YaRN (ext_factor 0 disables the ramp; attn_factor scales cos/sin as in ggml)
  float ext_factor = 0.0f;
  float attn_factor = 1.0f;
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  int n_ctx_orig = 0;                  // training context (yarn correction dims)
};

// Rotates n_heads heads of head_dim floats each (contiguous) for token position pos, in place.
void rope(float* x, int n_heads, int head_dim, int64_t pos, const rope_params& p);

// gate[i] = silu(gate[i]) * up[i]
void swiglu(float* gate, const float* up, int64_t n);

// In-place softmax of n floats (max-subtracted).
void softmax(float* x, int64_t n);

// Layout of one layer's KV cache: position-major, [n_ctx][n_kv_heads][head_dim].
enum class kv_type { f32, f16 };

// Causal self-attention with grouped-query heads for n_q query rows at positions
// pos0 .. pos0+n_q-1 over keys/values at positions 0 .. pos0+n_q-1 (already written to the
// cache). q: [n_q][n_heads][head_dim]; out: same shape. Head h uses KV head h / (n_heads /
// n_kv_heads). Scores are scaled by `scale` (1/sqrt(head_dim) normally). Split over heads and
// rows with the pool (may be null).
void attention(const float* q, int64_t n_q, int64_t pos0, const void* k_cache, const void* v_cache, kv_type kt,
               int n_heads, int n_kv_heads, int head_dim, float scale, float* out, thread_pool* pool);

// Writes n rows of [n_kv_heads * head_dim] floats into a cache at position pos (converting
// to the cache type).
void kv_store(void* cache, kv_type kt, int64_t pos, const float* rows, int64_t n, int64_t row_elems);

}  // namespace tandem::kernels::cpu
