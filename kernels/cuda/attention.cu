// Paged KV store, causal GQA attention and the Hadamard rotation of heads, the CUDA twins of
// kernels/cpu/ops.cpp (KV store, rotation) and attention.cpp. Attention keeps f32 throughout
// (also on an f16 cache, unlike the CPU's llama.cpp-compatible f16 accumulation), so it agrees
// with the CPU within float noise.
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

// How a row of each cache type is read and written: element e of a row that starts at byte
// `row` (memory/kv_pool.h's layout, kernels/cpu/ops.h's kv_bytes).
struct fmt_f32 {
  __device__ static float at(const char* row, int64_t e) { return reinterpret_cast<const float*>(row)[e]; }
  __device__ static void put(char* row, int64_t e, float v) { reinterpret_cast<float*>(row)[e] = v; }
};
struct fmt_f16 {
  __device__ static float at(const char* row, int64_t e) { return __half2float(reinterpret_cast<const __half*>(row)[e]); }
  // Round to nearest even, as the CPU's (ggml's) f32 -> f16 conversion into the cache.
  __device__ static void put(char* row, int64_t e, float v) { reinterpret_cast<__half*>(row)[e] = __float2half_rn(v); }
};
// ggml's block_q8_0 (an f16 scale, 32 int8) and block_q4_0 (an f16 scale, 16 bytes: element j in
// the low nibble of byte j, element j + 16 in the high one); every scale sits at an even byte.
struct fmt_q8_0 {
  static constexpr int bytes = 34;
  __device__ static float at(const char* row, int64_t e) {
    const char* b = row + (e >> 5) * bytes;
    return __half2float(*reinterpret_cast<const __half*>(b)) * static_cast<float>(static_cast<int8_t>(b[2 + (e & 31)]));
  }
};
struct fmt_q4_0 {
  static constexpr int bytes = 18;
  __device__ static float at(const char* row, int64_t e) {
    const char* b = row + (e >> 5) * bytes;
    const int j = static_cast<int>(e & 31);
    const auto q = static_cast<uint8_t>(b[2 + (j & 15)]);
    const int code = j < 16 ? (q & 15) : (q >> 4);
    return __half2float(*reinterpret_cast<const __half*>(b)) * static_cast<float>(code - 8);
  }
};

// Byte offset of position p's row in a paged cache (memory/kv_pool.h's layout).
__device__ __forceinline__ int64_t row_offset(const int32_t* table, int64_t p, int64_t block_tokens, int64_t block_stride, int64_t row_bytes) {
  return static_cast<int64_t>(table[p / block_tokens]) * block_stride + (p % block_tokens) * row_bytes;
}

// ---- kv_store ----

constexpr int k_store_block = 256;

template <class F>
__global__ void kv_store_kernel(char* kc, char* vc, const float* k_rows, const float* v_rows, row_map rows, int64_t block_tokens,
                                int64_t block_stride, int64_t row_elems, int64_t row_bytes) {
  const int64_t r = blockIdx.x;
  const int32_t* table = rows.tables + rows.table_of_row[r];
  const int64_t off = row_offset(table, rows.pos[r], block_tokens, block_stride, row_bytes);
  const float* ks = k_rows + r * row_elems;
  const float* vs = v_rows + r * row_elems;
  for (int64_t e = threadIdx.x; e < row_elems; e += blockDim.x) {
    F::put(kc + off, e, ks[e]);
    F::put(vc + off, e, vs[e]);
  }
}

// One warp quantizes one block of 32 elements (lane = element), with the CPU quantizers'
// formulas step for step: products and sums rounded apart (no fused multiply-add), so the
// blocks are the CPU's byte for byte.
__device__ void quantize_block_q8_0(float x, char* b, int lane) {
  float amax = fabsf(x);
  for (int o = k_warp / 2; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  if (lane == 0) *reinterpret_cast<__half*>(b) = __float2half_rn(d);
  b[2 + lane] = static_cast<char>(static_cast<int8_t>(roundf(__fmul_rn(x, id))));
}

__device__ void quantize_block_q4_0(float x, char* b, int lane) {
  // The element of largest magnitude, the first such on ties (the CPU's signed_absmax).
  float amax = fabsf(x);
  int at = lane;
  for (int o = k_warp / 2; o > 0; o >>= 1) {
    const float a2 = __shfl_xor_sync(0xffffffffu, amax, o);
    const int i2 = __shfl_xor_sync(0xffffffffu, at, o);
    if (a2 > amax || (a2 == amax && i2 < at)) {
      amax = a2;
      at = i2;
    }
  }
  const float mx = __shfl_sync(0xffffffffu, x, at);
  const float d = mx / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  const int code = min(15, static_cast<int>(__fadd_rn(__fmul_rn(x, id), 8.5f)));
  const int hi = __shfl_down_sync(0xffffffffu, code, 16);
  if (lane == 0) *reinterpret_cast<__half*>(b) = __float2half_rn(d);
  if (lane < 16) b[2 + lane] = static_cast<char>(static_cast<uint8_t>(code | (hi << 4)));
}

template <bool Q8>
__global__ void kv_store_quant_kernel(char* kc, char* vc, const float* k_rows, const float* v_rows, row_map rows, int64_t block_tokens,
                                      int64_t block_stride, int64_t row_elems, int64_t row_bytes) {
  const int64_t r = blockIdx.x;
  const int32_t* table = rows.tables + rows.table_of_row[r];
  const int64_t off = row_offset(table, rows.pos[r], block_tokens, block_stride, row_bytes);
  const int lane = threadIdx.x % k_warp, warp = threadIdx.x / k_warp;
  const int64_t nb = row_elems / 32;
  constexpr int bytes = Q8 ? fmt_q8_0::bytes : fmt_q4_0::bytes;
  for (int64_t b = warp; b < 2 * nb; b += blockDim.x / k_warp) {  // K's blocks, then V's
    const bool is_v = b >= nb;
    const int64_t bi = is_v ? b - nb : b;
    const float x = (is_v ? v_rows : k_rows)[r * row_elems + bi * 32 + lane];
    char* dst = (is_v ? vc : kc) + off + bi * bytes;
    if constexpr (Q8)
      quantize_block_q8_0(x, dst, lane);
    else
      quantize_block_q4_0(x, dst, lane);
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

template <class F>
__global__ void __launch_bounds__(k_threads)
    attention_kernel(const float* q, float* out, row_map rows, const char* kc, const char* vc, int64_t block_tokens, int64_t block_stride,
                     int64_t row_bytes, int64_t head_bytes, int n_heads, int group, int head_dim, float scale) {
  __shared__ float q_s[k_max_head_dim];
  __shared__ float score_s[k_tile];
  __shared__ float weight_s[k_tile];
  __shared__ int64_t off_s[k_tile];

  const int64_t rh = blockIdx.x;  // r * n_heads + h: also the index of the q and out vectors
  const int64_t r = rh / n_heads;
  const int h = static_cast<int>(rh - r * n_heads);
  const int64_t head_off = static_cast<int64_t>(h / group) * head_bytes;
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
      const int64_t off = row_offset(table, t0 + j, block_tokens, block_stride, row_bytes) + head_off;
      const char* kr = kc + off;
      float d = 0.0f;
      for (int e = lane; e < head_dim; e += k_warp) d += q_s[e] * F::at(kr, e);
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
      const char* vr = vc + off_s[j];
      for (int c = 0; c < k_dims_per_thread; ++c) {
        const int e = threadIdx.x + c * k_threads;
        if (e < head_dim) acc[c] += w * F::at(vr, e);
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
  if (kv.type != cpu::kv_type::f32 && kv.type != cpu::kv_type::f16 && kv.type != cpu::kv_type::q8_0 && kv.type != cpu::kv_type::q4_0)
    fail(op, "unknown cache type");
  if (cpu::kv_quantized(kv.type) && kv.row_elems % 32 != 0)
    fail(op, std::string("a ") + cpu::kv_type_name(kv.type) + " cache needs rows of a multiple of 32");
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
  auto* kc = static_cast<char*>(kv.k);
  auto* vc = static_cast<char*>(kv.v);
  const int64_t rb = cpu::kv_bytes(kv.type, kv.row_elems);
  switch (kv.type) {
    case cpu::kv_type::f32:
      kv_store_kernel<fmt_f32><<<blocks, k_store_block, 0, s>>>(kc, vc, k_rows, v_rows, rows, kv.block_tokens, kv.block_stride, kv.row_elems, rb);
      break;
    case cpu::kv_type::f16:
      kv_store_kernel<fmt_f16><<<blocks, k_store_block, 0, s>>>(kc, vc, k_rows, v_rows, rows, kv.block_tokens, kv.block_stride, kv.row_elems, rb);
      break;
    case cpu::kv_type::q8_0:
      kv_store_quant_kernel<true><<<blocks, k_store_block, 0, s>>>(kc, vc, k_rows, v_rows, rows, kv.block_tokens, kv.block_stride, kv.row_elems, rb);
      break;
    case cpu::kv_type::q4_0:
      kv_store_quant_kernel<false><<<blocks, k_store_block, 0, s>>>(kc, vc, k_rows, v_rows, rows, kv.block_tokens, kv.block_stride, kv.row_elems, rb);
      break;
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
  if (cpu::kv_quantized(kv.type) && head_dim % 32 != 0) fail("attention", "a quantized cache needs head_dim a multiple of 32");
  const auto* kc = static_cast<const char*>(kv.k);
  const auto* vc = static_cast<const char*>(kv.v);
  const int64_t rb = cpu::kv_bytes(kv.type, kv.row_elems), hb = cpu::kv_bytes(kv.type, head_dim);
  const auto grid = static_cast<unsigned>(blocks);
  const auto launch = [&](auto fmt) {
    attention_kernel<decltype(fmt)>
        <<<grid, k_threads, 0, s>>>(q, out, rows, kc, vc, kv.block_tokens, kv.block_stride, rb, hb, n_heads, group, head_dim, scale);
  };
  switch (kv.type) {
    case cpu::kv_type::f32:
      launch(fmt_f32{});
      break;
    case cpu::kv_type::f16:
      launch(fmt_f16{});
      break;
    case cpu::kv_type::q8_0:
      launch(fmt_q8_0{});
      break;
    case cpu::kv_type::q4_0:
      launch(fmt_q4_0{});
      break;
  }
  check_last("attention");
}

namespace {

// One CTA per (row, head): the head in shared memory, log2(head_dim) rounds of butterflies with
// a barrier between, in the CPU's order (cpu::hadamard_heads), then the 1/sqrt(head_dim) scale.
__global__ void hadamard_kernel(float* x, int64_t row_stride, int n_heads, int head_dim, float norm) {
  __shared__ float v[k_max_head_dim];
  const int64_t r = blockIdx.x / n_heads;
  const int h = static_cast<int>(blockIdx.x % n_heads);
  float* head = x + r * row_stride + static_cast<int64_t>(h) * head_dim;
  for (int e = threadIdx.x; e < head_dim; e += blockDim.x) v[e] = head[e];
  __syncthreads();
  for (int len = 1; len < head_dim; len <<= 1) {
    // Pair i: element j = (i / len) * 2 * len + i % len with j + len.
    for (int i = threadIdx.x; i < head_dim / 2; i += blockDim.x) {
      const int j = (i / len) * 2 * len + i % len;
      const float a = v[j], b = v[j + len];
      v[j] = a + b;
      v[j + len] = a - b;
    }
    __syncthreads();
  }
  for (int e = threadIdx.x; e < head_dim; e += blockDim.x) head[e] = v[e] * norm;
}

}  // namespace

void hadamard_heads(float* x, int64_t n_rows, int64_t row_stride, int n_heads, int head_dim, stream_t s) {
  if (head_dim <= 0 || head_dim > k_max_head_dim || (head_dim & (head_dim - 1)) != 0)
    fail("hadamard_heads", "head_dim must be a power of two up to " + std::to_string(k_max_head_dim) + ", got " + std::to_string(head_dim));
  if (n_rows < 0 || n_heads < 0) fail("hadamard_heads", "negative row or head count");
  if (n_rows == 0 || n_heads == 0) return;
  if (n_rows * n_heads > INT32_MAX) fail("hadamard_heads", "too many rows");
  const float norm = 1.0f / sqrtf(static_cast<float>(head_dim));
  hadamard_kernel<<<static_cast<unsigned>(n_rows * n_heads), 128, 0, s>>>(x, row_stride, n_heads, head_dim, norm);
  check_last("hadamard_heads");
}

}  // namespace tandem::kernels::cuda
