// Sampling helpers on the logits: greedy argmax per row, and the top k of one row (the
// candidates a sampler needs, so only k values cross to the host instead of a vocabulary).
// Order shared by both: larger value first, ties to the lower index, NaN below everything
// (even -inf), and -0 equal to +0.
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
constexpr unsigned k_full = 0xffffffffu;

void fail(const char* op, const std::string& why) { throw std::invalid_argument(std::string(op) + ": " + why); }

// ---- argmax ----

constexpr int k_argmax_block = 1024;

// Whether (v, i) comes before (bv, bi) in the shared order.
__device__ __forceinline__ bool before(float v, int32_t i, float bv, int32_t bi) {
  const bool v_nan = isnan(v);
  const bool b_nan = isnan(bv);
  if (v_nan || b_nan) return v_nan && b_nan ? i < bi : b_nan;
  if (v != bv) return v > bv;
  return i < bi;
}

__global__ void __launch_bounds__(k_argmax_block) argmax_kernel(const float* x, int64_t n, int32_t* out) {
  __shared__ float val_s[k_argmax_block / k_warp];
  __shared__ int32_t idx_s[k_argmax_block / k_warp];
  const float* xr = x + static_cast<int64_t>(blockIdx.x) * n;
  // A NaN at an index past every real one loses to any element, so it is a neutral start.
  float bv = __int_as_float(0x7fc00000);
  int32_t bi = INT32_MAX;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = xr[i];
    if (before(v, static_cast<int32_t>(i), bv, bi)) {
      bv = v;
      bi = static_cast<int32_t>(i);
    }
  }
  for (int o = k_warp / 2; o > 0; o >>= 1) {
    const float ov = __shfl_xor_sync(k_full, bv, o);
    const int32_t oi = __shfl_xor_sync(k_full, bi, o);
    if (before(ov, oi, bv, bi)) {
      bv = ov;
      bi = oi;
    }
  }
  const int lane = threadIdx.x % k_warp;
  const int warp = threadIdx.x / k_warp;
  if (lane == 0) {
    val_s[warp] = bv;
    idx_s[warp] = bi;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < static_cast<int>(blockDim.x) / k_warp; ++w)
      if (before(val_s[w], idx_s[w], bv, bi)) {
        bv = val_s[w];
        bi = idx_s[w];
      }
    out[blockIdx.x] = bi;
  }
}

// ---- top_k ----

// One CTA finds the k-th largest key by radix select (four passes of 8 bits, counting only
// the elements that still share the key's known high bits), then gathers the elements above
// it plus the lowest-indexed ones equal to it, and ranks those k. Five reads of the row in
// all, whatever k is, and no scratch beyond shared memory.
constexpr int k_top_k_block = 1024;
constexpr int k_top_k_warps = k_top_k_block / k_warp;

// An unsigned key in the shared order: larger key = earlier; NaN maps to 0, below -inf.
__device__ __forceinline__ uint32_t order_key(float v) {
  if (isnan(v)) return 0u;
  uint32_t u = __float_as_uint(v);
  if ((u << 1) == 0u) u = 0u;  // -0 is +0
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__global__ void __launch_bounds__(k_top_k_block) top_k_kernel(const float* x, int64_t n, int k, float* values, int32_t* ids) {
  __shared__ uint32_t hist[256];
  __shared__ uint32_t sel_digit;
  __shared__ uint32_t sel_remaining;
  __shared__ uint32_t warp_eq[k_top_k_warps];
  __shared__ int n_greater;
  __shared__ int32_t cand_id[k_top_k_max];
  __shared__ uint32_t cand_key[k_top_k_max];

  const int tid = threadIdx.x;
  const int lane = tid % k_warp;
  const int warp = tid / k_warp;

  // Invariant: the k-th largest key has the bits `prefix` under `mask`, and is the
  // `remaining`-th largest of the keys that do (1 <= remaining <= their count).
  uint32_t prefix = 0, mask = 0, remaining = static_cast<uint32_t>(k);
  for (int shift = 24; shift >= 0; shift -= 8) {
    for (int b = tid; b < 256; b += blockDim.x) hist[b] = 0;
    __syncthreads();
    // The loop bound is the same for the whole block, so every lane reaches the match.
    for (int64_t base = 0; base < n; base += blockDim.x) {
      const int64_t i = base + tid;
      uint32_t digit = 256;  // not counted
      if (i < n) {
        const uint32_t key = order_key(x[i]);
        if ((key & mask) == prefix) digit = (key >> shift) & 255u;
      }
      // Logits crowd into a few digits; one atomic per distinct digit per warp keeps those
      // bins from serialising 32 ways.
      const unsigned peers = __match_any_sync(k_full, digit);
      if (digit < 256 && lane == __ffs(peers) - 1) atomicAdd(&hist[digit], static_cast<uint32_t>(__popc(peers)));
    }
    __syncthreads();
    if (warp == 0) {
      // Lane l holds bins 255-8l down to 248-8l, so lanes run from the largest digits down.
      uint32_t c[8];
      uint32_t own = 0;
      for (int b = 0; b < 8; ++b) {
        c[b] = hist[255 - 8 * lane - b];
        own += c[b];
      }
      uint32_t incl = own;
      for (int o = 1; o < k_warp; o <<= 1) {
        const uint32_t t = __shfl_up_sync(k_full, incl, o);
        if (lane >= o) incl += t;
      }
      uint32_t above = incl - own;                   // counted keys with larger digits than this lane's bins
      if (above < remaining && remaining <= incl) {  // exactly one lane
        for (int b = 0; b < 8; ++b) {
          if (remaining <= above + c[b]) {
            sel_digit = static_cast<uint32_t>(255 - 8 * lane - b);
            sel_remaining = remaining - above;
            break;
          }
          above += c[b];
        }
      }
    }
    __syncthreads();
    // Read before the next pass's two barriers; warp 0 rewrites them only after both.
    prefix |= sel_digit << shift;
    mask |= 255u << shift;
    remaining = sel_remaining;
  }

  // prefix is now the k-th largest key; `remaining` keys equal to it are taken, the lowest
  // indices first, after the k - remaining keys above it.
  const uint32_t kth = prefix;
  const int n_above = k - static_cast<int>(remaining);
  if (tid == 0) n_greater = 0;
  __syncthreads();
  uint32_t eq_before = 0;  // keys equal to kth in earlier chunks; the same in every thread
  for (int64_t base = 0; base < n; base += blockDim.x) {
    const int64_t i = base + tid;
    uint32_t key = 0;
    bool gt = false, eq = false;
    if (i < n) {
      key = order_key(x[i]);
      gt = key > kth;
      eq = key == kth;
    }
    if (gt) {  // their order is fixed by the ranking below, so any slot will do
      const int slot = atomicAdd(&n_greater, 1);
      cand_id[slot] = static_cast<int32_t>(i);
      cand_key[slot] = key;
    }
    const unsigned eq_bits = __ballot_sync(k_full, eq);
    if (lane == 0) warp_eq[warp] = static_cast<uint32_t>(__popc(eq_bits));
    __syncthreads();
    uint32_t rank = eq_before + static_cast<uint32_t>(__popc(eq_bits & ((1u << lane) - 1u)));
    uint32_t chunk = 0;
    for (int w = 0; w < k_top_k_warps; ++w) {
      if (w < warp) rank += warp_eq[w];
      chunk += warp_eq[w];
    }
    if (eq && rank < remaining) {
      cand_id[n_above + rank] = static_cast<int32_t>(i);
      cand_key[n_above + rank] = key;
    }
    eq_before += chunk;
    __syncthreads();  // warp_eq is rewritten by the next chunk
  }

  // Exactly k candidates with distinct indices: each one's rank is how many precede it.
  if (tid < k) {
    const uint32_t key = cand_key[tid];
    const int32_t id = cand_id[tid];
    int rank = 0;
    for (int j = 0; j < k; ++j) rank += cand_key[j] > key || (cand_key[j] == key && cand_id[j] < id);
    values[rank] = x[id];
    ids[rank] = id;
  }
}

}  // namespace

void argmax(const float* x, int64_t n_rows, int64_t n, int32_t* out, stream_t s) {
  if (n_rows < 0) fail("argmax", "negative row count");
  if (n_rows == 0) return;
  if (n <= 0 || n > INT32_MAX) fail("argmax", "row length must be in [1, 2^31), got " + std::to_string(n));
  if (!x || !out) fail("argmax", "null input or output");
  if (n_rows > INT32_MAX) fail("argmax", "too many rows");
  argmax_kernel<<<static_cast<unsigned>(n_rows), k_argmax_block, 0, s>>>(x, n, out);
  check_last("argmax");
}

void top_k(const float* x, int64_t n, int k, float* values, int32_t* ids, stream_t s) {
  if (n <= 0 || n > INT32_MAX) fail("top_k", "n must be in [1, 2^31), got " + std::to_string(n));
  if (k < 1 || k > k_top_k_max || k > n)
    fail("top_k", "k must be in [1, min(" + std::to_string(k_top_k_max) + ", n = " + std::to_string(n) + ")], got " + std::to_string(k));
  if (!x || !values || !ids) fail("top_k", "null input or output");
  top_k_kernel<<<1, k_top_k_block, 0, s>>>(x, n, k, values, ids);
  check_last("top_k");
}

}  // namespace tandem::kernels::cuda
