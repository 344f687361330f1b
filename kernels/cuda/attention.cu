// Paged KV store and causal GQA attention, the CUDA twins of kernels/cpu/ops.cpp (KV store) and
// attention.cpp. Attention keeps f32 throughout (also on an f16 cache, unlike the CPU's
// llama.cpp-compatible f16 accumulation), so it agrees with the CPU within float noise.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"

namespace tandem::kernels::cuda {

namespace {

constexpr int k_warp = 32;

void fail(const char* op, const std::string& why) { throw std::invalid_argument(std::string(op) + ": " + why); }

__device__ __forceinline__ float load(const float* p) { return *p; }
__device__ __forceinline__ float load(const __half* p) { return __half2float(*p); }

__device__ __forceinline__ void store(float* p, float v) { *p = v; }
// Round to nearest even, as the CPU's (ggml's) f32 -> f16 conversion into the cache.
__device__ __forceinline__ void store(__half* p, float v) { *p = __float2half_rn(v); }

// Element offset of position p's row in a paged cache (memory/kv_pool.h's layout).
__device__ __forceinline__ int64_t row_offset(const int32_t* table, int64_t p, int64_t block_tokens, int64_t block_stride, int64_t row_elems) {
  return static_cast<int64_t>(table[p / block_tokens]) * block_stride + (p % block_tokens) * row_elems;
}

// ---- kv_store ----

constexpr int k_store_block = 256;

template <class T>
__global__ void kv_store_kernel(T* kc, T* vc, const float* k_rows, const float* v_rows, row_map rows, int64_t block_tokens, int64_t block_stride,
                                int64_t row_elems) {
  const int64_t r = blockIdx.x;
  const int32_t* table = rows.tables + rows.table_of_row[r];
  const int64_t off = row_offset(table, rows.pos[r], block_tokens, block_stride, row_elems);
  const float* ks = k_rows + r * row_elems;
  const float* vs = v_rows + r * row_elems;
  for (int64_t e = threadIdx.x; e < row_elems; e += blockDim.x) {
    store(kc + off + e, ks[e]);
    store(vc + off + e, vs[e]);
  }
}

// ---- attention ----

// One CTA per (row, query head) scans the row's keys in tiles of k_tile positions with an
// online softmax, so shared memory does not grow with the context: warps score the tile's
// keys (one key per warp at a time, lanes splitting the dot product), then every thread
// accumulates its own output dims over the tile's values (coalesced row reads).
constexpr int k_threads = 128;
constexpr int k_warps = k_threads / k_warp;
constexpr int k_tile = 64;
constexpr int k_max_head_dim = 256;
constexpr int k_dims_per_thread = k_max_head_dim / k_threads;
static_assert(k_tile <= k_threads, "each tile weight is computed by one thread");

template <class T>
__global__ void __launch_bounds__(k_threads)
    attention_kernel(const float* q, float* out, row_map rows, const T* kc, const T* vc, int64_t block_tokens, int64_t block_stride,
                     int64_t row_elems, int n_heads, int group, int head_dim, float scale) {
  __shared__ float q_s[k_max_head_dim];
  __shared__ float score_s[k_tile];
  __shared__ float weight_s[k_tile];
  __shared__ int64_t off_s[k_tile];

  const int64_t rh = blockIdx.x;  // r * n_heads + h: also the index of the q and out vectors
  const int64_t r = rh / n_heads;
  const int h = static_cast<int>(rh - r * n_heads);
  const int64_t head_off = static_cast<int64_t>(h / group) * head_dim;
  const int lane = threadIdx.x % k_warp;
  const int warp = threadIdx.x / k_warp;

  const float* qv = q + rh * head_dim;
  for (int e = threadIdx.x; e < head_dim; e += k_threads) q_s[e] = qv[e];
  const int32_t* table = rows.tables + rows.table_of_row[r];
  const int64_t n_keys = static_cast<int64_t>(rows.pos[r]) + 1;
  __syncthreads();

  float m = -INFINITY;  // running max of the scores seen
  float l = 0.0f;       // running sum of exp(score - m)
  float acc[k_dims_per_thread];
  for (int c = 0; c < k_dims_per_thread; ++c) acc[c] = 0.0f;

  for (int64_t t0 = 0; t0 < n_keys; t0 += k_tile) {
    const int tn = static_cast<int>(n_keys - t0 < k_tile ? n_keys - t0 : k_tile);
    for (int j = warp; j < tn; j += k_warps) {
      const int64_t off = row_offset(table, t0 + j, block_tokens, block_stride, row_elems) + head_off;
      const T* kr = kc + off;
      float d = 0.0f;
      for (int e = lane; e < head_dim; e += k_warp) d += q_s[e] * load(kr + e);
      for (int o = k_warp / 2; o > 0; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
      if (lane == 0) {
        score_s[j] = d * scale;
        off_s[j] = off;  // this head's value row sits at the same offset
      }
    }
    __syncthreads();

    // Every thread derives the same new max from the same shared scores (same order, same
    // bits), so no broadcast is needed.
    float tile_max = -INFINITY;
    for (int j = 0; j < tn; ++j) tile_max = fmaxf(tile_max, score_s[j]);
    const float m_new = fmaxf(m, tile_max);
    // All scores -inf so far: subtract 0 so exp gives 0 weights instead of NaN from inf - inf.
    const float base = m_new == -INFINITY ? 0.0f : m_new;
    const float rescale = expf(m - base);  // 0 on the first tile (m = -inf)
    if (threadIdx.x < tn) weight_s[threadIdx.x] = expf(score_s[threadIdx.x] - base);
    __syncthreads();

    float tile_sum = 0.0f;
    for (int c = 0; c < k_dims_per_thread; ++c) acc[c] *= rescale;
    for (int j = 0; j < tn; ++j) {
      const float w = weight_s[j];
      tile_sum += w;
      const T* vr = vc + off_s[j];
      for (int c = 0; c < k_dims_per_thread; ++c) {
        const int e = threadIdx.x + c * k_threads;
        if (e < head_dim) acc[c] += w * load(vr + e);
      }
    }
    l = l * rescale + tile_sum;
    m = m_new;
    __syncthreads();  // the next tile overwrites scores, weights and offsets
  }

  float* ov = out + rh * head_dim;
  // No keys (a negative position, which callers should not pass) gives zeros, not 0/0.
  const float inv = n_keys > 0 ? 1.0f / l : 0.0f;
  for (int c = 0; c < k_dims_per_thread; ++c) {
    const int e = threadIdx.x + c * k_threads;
    if (e < head_dim) ov[e] = acc[c] * inv;
  }
}

void check_layer(const char* op, const paged_layer& kv, const row_map& rows) {
  if (!kv.k || !kv.v) fail(op, "null K or V cache");
  if (kv.type != cpu::kv_type::f32 && kv.type != cpu::kv_type::f16) fail(op, "unknown cache type");
  if (kv.block_tokens <= 0) fail(op, "block_tokens must be positive, got " + std::to_string(kv.block_tokens));
  if (kv.row_elems <= 0 || kv.block_stride < 0) fail(op, "bad cache row or block stride");
  if (!rows.pos || !rows.tables || !rows.table_of_row) fail(op, "null row map");
}

}  // namespace

void kv_store(const paged_layer& kv, const float* k_rows, const float* v_rows, int64_t n_rows, const row_map& rows, stream_t s) {
  if (n_rows < 0) fail("kv_store", "negative row count");
  if (n_rows == 0) return;
  check_layer("kv_store", kv, rows);
  if (!k_rows || !v_rows) fail("kv_store", "null K or V rows");
  if (n_rows > INT32_MAX) fail("kv_store", "too many rows");
  const unsigned blocks = static_cast<unsigned>(n_rows);
  if (kv.type == cpu::kv_type::f32) {
    kv_store_kernel<float><<<blocks, k_store_block, 0, s>>>(static_cast<float*>(kv.k), static_cast<float*>(kv.v), k_rows, v_rows, rows,
                                                            kv.block_tokens, kv.block_stride, kv.row_elems);
  } else {
    kv_store_kernel<__half><<<blocks, k_store_block, 0, s>>>(static_cast<__half*>(kv.k), static_cast<__half*>(kv.v), k_rows, v_rows, rows,
                                                             kv.block_tokens, kv.block_stride, kv.row_elems);
  }
  check_last("kv_store");
}

void attention(const float* q, float* out, int64_t n_rows, const row_map& rows, const paged_layer& kv, int n_heads, int n_kv_heads, int head_dim,
               float scale, stream_t s) {
  if (n_rows < 0) fail("attention", "negative row count");
  if (n_rows == 0) return;
  if (n_heads <= 0 || n_kv_heads <= 0 || n_heads % n_kv_heads != 0)
    fail("attention", "n_heads (" + std::to_string(n_heads) + ") must be a positive multiple of n_kv_heads (" + std::to_string(n_kv_heads) + ")");
  if (head_dim <= 0 || head_dim > k_max_head_dim)
    fail("attention", "head_dim must be in [1, " + std::to_string(k_max_head_dim) + "], got " + std::to_string(head_dim));
  check_layer("attention", kv, rows);
  if (kv.row_elems < static_cast<int64_t>(n_kv_heads) * head_dim) fail("attention", "row_elems below n_kv_heads * head_dim");
  if (!q || !out) fail("attention", "null q or out");
  const int64_t blocks = n_rows * n_heads;
  if (blocks > INT32_MAX) fail("attention", "too many rows");
  const int group = n_heads / n_kv_heads;
  if (kv.type == cpu::kv_type::f32) {
    attention_kernel<float><<<static_cast<unsigned>(blocks), k_threads, 0, s>>>(q, out, rows, static_cast<const float*>(kv.k),
                                                                                static_cast<const float*>(kv.v), kv.block_tokens, kv.block_stride,
                                                                                kv.row_elems, n_heads, group, head_dim, scale);
  } else {
    attention_kernel<__half><<<static_cast<unsigned>(blocks), k_threads, 0, s>>>(q, out, rows, static_cast<const __half*>(kv.k),
                                                                                 static_cast<const __half*>(kv.v), kv.block_tokens, kv.block_stride,
                                                                                 kv.row_elems, n_heads, group, head_dim, scale);
  }
  check_last("attention");
}

}  // namespace tandem::kernels::cuda
