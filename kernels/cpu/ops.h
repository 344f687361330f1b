// Element-wise and attention ops of a Llama-family forward pass (F32 activations).
// Each op mirrors the arithmetic of the ggml CPU op it replaces (noted per op), so that a
// model run here tracks llama.cpp's logits on the same file within float noise.
// None of them throws or allocates once warm; preconditions are the caller's to keep.
#pragma once

#include <cstdint>

namespace tandem::kernels::cpu {

// Only passed by pointer here; a declaration (not thread_pool.h) keeps this header C++17 for
// the CUDA sources that share its parameter types (kernels/cuda/ops.h).
class thread_pool;

// out[i] = x[i] / sqrt(mean(x^2) + eps) * w[i]; w may be null (no scale). out may equal x.
// The sum of squares is accumulated in double (as ggml's rms_norm).
void rms_norm(const float* x, const float* w, float* out, int64_t n, float eps);

enum class rope_pairing {
  adjacent,  // rotate (x[2i], x[2i+1]): llama, mistral (ggml "NORM")
  neox,      // rotate (x[i], x[i + n_rot/2]): qwen2, qwen3 (ggml "NEOX", HF rotate_half)
};

// Everything RoPE needs besides the data; built once from the model config.
// Pair i (0 <= i < n_rot/2) turns by theta_i = pos * freq_base^(-2i/n_rot), divided by
// freq_factors[i] when given, then scaled: plain/linear: theta_i * freq_scale; YaRN
// (ext_factor != 0): a blend of theta_i * freq_scale and theta_i ramped over the pairs
// between the correction dims of beta_fast and beta_slow, and cos/sin multiplied by
// attn_factor * (1 + 0.1 ln(1/freq_scale)). Without YaRN cos/sin are multiplied by attn_factor.
struct rope_params {
  int n_rot = 0;  // rotated dims per head, even, <= head_dim (rest pass
                  // through); <= 0 means all of head_dim
  float freq_base = 10000.0f;
  float freq_scale = 1.0f;  // 1/linear factor (linear and yarn scaling)
  rope_pairing pairing = rope_pairing::adjacent;
  const float* freq_factors = nullptr;  // llama3 rope_freqs: n_rot/2 divisors of theta_i, or null
  // YaRN (ext_factor 0 disables the ramp; attn_factor scales cos/sin as in ggml)
  float ext_factor = 0.0f;
  float attn_factor = 1.0f;
  float beta_fast = 32.0f;
  float beta_slow = 1.0f;
  int n_ctx_orig = 0;  // training context (yarn correction dims); > 0 with yarn
};

// Rotates n_heads heads of head_dim floats each (contiguous) for token position pos, in place.
// cos/sin are computed once per call and shared by the heads, so pass all heads of a token
// in one call. Safe to call concurrently from several threads.
void rope(float* x, int n_heads, int head_dim, int64_t pos, const rope_params& p);

// rope in two steps, for callers that rotate several vectors at one position (a forward pass:
// q and k of every layer): rope_table writes the rope_table_floats(head_dim, p) cos/sin
// values of position pos to cs, and rope_apply rotates as rope does with them, bit for bit.
int rope_table_floats(int head_dim, const rope_params& p);
void rope_table(int64_t pos, int head_dim, const rope_params& p, float* cs);
void rope_apply(float* x, int n_heads, int head_dim, const float* cs, const rope_params& p);

// gate[i] = silu(gate[i]) * up[i]
void swiglu(float* gate, const float* up, int64_t n);
// The same, split over the pool when n is large enough to pay for it (same results).
void swiglu(float* gate, const float* up, int64_t n, thread_pool* pool);
// The same with a vector e^x (within 2 ulp of e^x) where the CPU has AVX2, for rows the
// server computes (forward_context::set_prompt_end): about 5x fewer cycles than expf, which
// was ~6% of a batched decode step. Each element's result depends on its own inputs only, not
// on n, the split over the pool or where the element lies.
void swiglu_fast(float* gate, const float* up, int64_t n, thread_pool* pool);

// In-place softmax of n floats (max-subtracted, F32 exponentials, sum kept in double).
// Needs at least one finite value.
void softmax(float* x, int64_t n);

// Element type of one layer's KV cache, which is position-major:
// [n_ctx][n_kv_heads][head_dim], so the row of one position is n_kv_heads * head_dim elements.
// q8_0 and q4_0 store ggml's blocks of 32 elements (block_q8_0: 34 bytes, block_q4_0: 18), so
// head_dim must be a multiple of 32 for them: a head's elements are whole blocks of the row.
enum class kv_type { f32, f16, q8_0, q4_0 };
inline constexpr int64_t k_kv_quant_block = 32;

// "f32", "f16", "q8_0", "q4_0".
const char* kv_type_name(kv_type t);
inline bool kv_quantized(kv_type t) { return t == kv_type::q8_0 || t == kv_type::q4_0; }
// Bytes of `elems` cache elements (a multiple of k_kv_quant_block for the quantized types).
inline int64_t kv_bytes(kv_type t, int64_t elems) {
  switch (t) {
    case kv_type::f32:
      return elems * 4;
    case kv_type::f16:
      return elems * 2;
    case kv_type::q8_0:
      return elems / k_kv_quant_block * 34;
    case kv_type::q4_0:
      return elems / k_kv_quant_block * 18;
  }
  return 0;
}

// Causal self-attention with grouped-query heads for n_q query rows at positions
// pos0 .. pos0+n_q-1 over keys/values at positions 0 .. pos0+n_q-1 (already written to the
// cache): row r sees positions 0 .. pos0+r. q: [n_q][n_heads][head_dim]; out: same shape
// (must not alias q). Head h uses KV head h / (n_heads / n_kv_heads); n_heads must be a
// multiple of n_kv_heads. Scores are scaled by `scale` (1/sqrt(head_dim) normally).
// With an f16 cache the arithmetic is llama.cpp's default CPU (flash-attention) path: Q
// rounded to f16, online softmax, values accumulated in f16; with f32 nothing is rounded; with
// q8_0 or q4_0 each key and value row is dequantized to f32 and the rest is f32 (an online
// softmax over blocks of 16 keys, attention_quant.cpp).
// The SIMD paths reproduce the scalar one bit for bit on an f16 cache (attention_impl.h).
// Split over (row, KV head) pairs with the pool (may be null: runs on the calling thread); the
// query heads sharing a KV head are split further only when that leaves threads idle.
// Scratch is per thread and reused: no allocation once warm (for an f32 cache, once the
// longest context has been seen).
void attention(const float* q, int64_t n_q, int64_t pos0, const void* k_cache, const void* v_cache, kv_type kt, int n_heads, int n_kv_heads,
               int head_dim, float scale, float* out, thread_pool* pool);

// Where a sequence's cache rows are when the cache is paged (blocks of positions from a
// shared pool, the executor's KV): position p's row is at byte
// table[p / block_tokens] * block_stride + (p % block_tokens) * row_bytes of the cache, where
// row_bytes = kv_bytes(kt, n_kv_heads * head_dim). block_tokens must be a multiple of 16 (the
// attention kernels read keys 16 at a time from one block); for f32 and f16 caches
// block_stride must be a multiple of the element size. A null table means one contiguous
// cache: position p at byte p * row_bytes.
struct kv_pages {
  const int32_t* table = nullptr;
  int64_t block_tokens = 0;
  int64_t block_stride = 0;  // bytes from one block to the next
};

// One sequence's part of attention_many: n_q query rows at positions pos0 .. pos0+n_q-1 over
// its own caches, as attention() takes them, contiguous or paged.
struct attention_run {
  const float* q;
  int64_t n_q;
  int64_t pos0;
  const void* k_cache;
  const void* v_cache;
  float* out;
  kv_pages pages = {};
  // The first prompt_rows rows (a prompt's; the engine asks for every row) take, where the CPU
  // has AVX-512 or AVX2, the tiled kernel, which reads each key and value once for a tile of
  // rows and keeps f32 throughout (not llama.cpp's f16 arithmetic; results differ from it by
  // float noise). A row's result does not depend on the other rows of the call, so a sequence gets
  // the same KV however it is chunked or batched. The other rows take the exact path.
  int64_t prompt_rows = 0;
};

// attention() for several sequences at once (a batched decode step: one row each) in one pass
// over the pool, so the step synchronises once rather than once per sequence. Each run's
// results equal a separate attention() call bit for bit.
void attention_many(const attention_run* runs, int64_t n_runs, kv_type kt, int n_heads, int n_kv_heads, int head_dim, float scale, thread_pool* pool);

// One member's part of a kernel call split by a team (thread_pool::run_team): member `index`
// of `count` runs a fixed share of the call on its own thread.
struct team_part {
  int index = 0;
  int count = 1;
};

// attention_many, one member's part: a fixed share of the (run, rows, KV head) tasks, cut as
// for a pool of `count` threads; for one decode row, a contiguous share of its query heads
// (split where it falls, even inside a KV head's group). All parts together write what
// attention_many writes, bit for bit.
void attention_many_part(const attention_run* runs, int64_t n_runs, kv_type kt, int n_heads, int n_kv_heads, int head_dim, float scale,
                         team_part part);

// Writes n rows of row_elems (= n_kv_heads * head_dim) floats into a cache at positions
// pos .. pos+n-1, converting to the cache type (f16: round to nearest even; q8_0, q4_0:
// ggml's reference quantizers, byte for byte).
void kv_store(void* cache, kv_type kt, int64_t pos, const float* rows, int64_t n, int64_t row_elems);

// Rotates each head_dim-wide head of n_rows rows (row r at x + r * row_stride, n_heads heads)
// in place by the normalised Walsh-Hadamard transform H / sqrt(head_dim). H is symmetric and
// orthogonal, so applying it twice gives the rows back (within float rounding) and dot
// products of rotated vectors are those of the originals: rotating queries and keys alike
// leaves the scores, rotating the values and then the attention output leaves the output.
// Quantized KV stores rotated rows, whose outliers are spread over the head, so that one large
// element no longer sets the scale of its whole block (QuaRot). head_dim: a power of two.
void hadamard_heads(float* x, int64_t n_rows, int64_t row_stride, int n_heads, int head_dim);

}  // namespace tandem::kernels::cpu
