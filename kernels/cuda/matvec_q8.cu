// Decode matvec on integer dot products: the activations are quantized to int8 per 32 values
// (scale amax / 127, codes x * 127 / amax rounded to nearest even: the CPU's Q8_0 activation
// codes (act_quant.cpp), with the scale kept in f32 rather than f16), then every weight
// part is multiplied with `dp4a`, four codes per instruction, and scaled once per sub-block.
//
// Why: the f32 matvec (matvec.cu) spends about six instructions per weight (extract, convert,
// scale, load x, multiply-add) and is issue-bound on an H200: the 1B model's Q4_K rows ran at
// 290-380 GB/s, a tenth of the copy bandwidth, with the schedulers idle on load latency. Here
// a weight costs about one instruction.
//
// Layout and threads as matvec.cu: one CTA of 4 warps per output row, `lanes` consecutive
// threads per block, partial sums meeting through shuffles and shared memory. The scratch
// holds xq (int8 [n_x][cols]) and then xd (f32 [n_x][cols / 32], the scales).
#include <cuda_runtime.h>

#include <climits>
#include <stdexcept>
#include <string>

#include "kernels/cuda/matvec_cta.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/quant_blocks.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/op_table.h"

namespace tandem::kernels::cuda {
namespace {

using detail::ld16;
using detail::ld8;
using detail::ld_f16;
using detail::ld_u32;  // 4 weight bytes from a 2-byte aligned address (GGUF rows are only that aligned)

constexpr int k_warp = 32;
constexpr int k_threads = detail::k_matvec_threads;
constexpr int k_warps = detail::k_matvec_warps;
constexpr int k_qx = 32;  // activation values per int8 scale
constexpr size_t k_align = 256;

size_t round_up(size_t n) { return (n + k_align - 1) / k_align * k_align; }

// 4 int8 activations; xq rows start at multiples of 32 bytes of an aligned buffer.
__device__ __forceinline__ int ld_x4(const int8_t* p) { return *reinterpret_cast<const int*>(p); }
constexpr int k_ones = 0x01010101;

// Each weight type: dot<NX>(block, part, xq, xd, blk, cols, acc) adds part `part` of block
// `blk` of a row times every activation row r < NX to acc[r].

// Q8_0: part p (of 2) holds codes 16p .. 16p+15.
struct q8_0_dot {
  static constexpr int qk = 32, bytes = 34, lanes = 2;
  template <int NX>
  __device__ static void dot(const uint8_t* b, int p, const int8_t* xq, const float* xd, int64_t blk, int cols, float (&acc)[NX]) {
    const float d = ld_f16(b);
    int w[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) w[k] = static_cast<int>(ld_u32(b + 2 + 16 * p + 4 * k));
    const int n_sub = cols / k_qx;
#pragma unroll
    for (int r = 0; r < NX; ++r) {
      const int8_t* x = xq + static_cast<int64_t>(r) * cols + blk * 32 + 16 * p;
      int s = 0;
#pragma unroll
      for (int k = 0; k < 4; ++k) s = __dp4a(w[k], ld_x4(x + 4 * k), s);
      acc[r] += d * xd[static_cast<int64_t>(r) * n_sub + blk] * static_cast<float>(s);
    }
  }
};

// Q4_0: part p (of 2) takes qs bytes 8p .. 8p+7: low nibbles are codes 8p.., high nibbles
// codes 16+8p..; each code minus 8.
struct q4_0_dot {
  static constexpr int qk = 32, bytes = 18, lanes = 2;
  template <int NX>
  __device__ static void dot(const uint8_t* b, int p, const int8_t* xq, const float* xd, int64_t blk, int cols, float (&acc)[NX]) {
    const float d = ld_f16(b);
    int lo[2], hi[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const uint32_t u = ld_u32(b + 2 + 8 * p + 4 * k);
      lo[k] = static_cast<int>(__vsub4(u & 0x0F0F0F0Fu, 0x08080808u));
      hi[k] = static_cast<int>(__vsub4((u >> 4) & 0x0F0F0F0Fu, 0x08080808u));
    }
    const int n_sub = cols / k_qx;
#pragma unroll
    for (int r = 0; r < NX; ++r) {
      const int8_t* x = xq + static_cast<int64_t>(r) * cols + blk * 32 + 8 * p;
      int s = 0;
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        s = __dp4a(lo[k], ld_x4(x + 4 * k), s);
        s = __dp4a(hi[k], ld_x4(x + 16 + 4 * k), s);
      }
      acc[r] += d * xd[static_cast<int64_t>(r) * n_sub + blk] * static_cast<float>(s);
    }
  }
};

// Bits 0..3 of h moved to bit 4 of bytes 0..3: four 5th bits beside four nibbles.
__device__ __forceinline__ uint32_t spread_bits4(uint32_t h) {
  return ((h << 4) & 0x10u) | ((h << 11) & 0x1000u) | ((h << 18) & 0x100000u) | ((h << 25) & 0x10000000u);
}

// Q4_1 / Q5_0 / Q5_1 (detail::legacy_layout): part p (of 2) as q4_0_dot, codes 5 bits wide
// when qh is there. Without an offset codes are signed (Q5_0: q - 16). With an offset (x = d*q + m) a part adds
// xd * (d * sum(q x) + m * sum(x)), sum(x) taken by one more dp4a against ones, as Q4_K's
// mins are: the int8 scratch then needs no block sums.
template <bool HasM, bool HasQh>
struct legacy_dot {
  using L = detail::legacy_layout<HasM, HasQh>;
  static constexpr int qk = 32, bytes = L::bytes, lanes = 2;
  template <int NX>
  __device__ static void dot(const uint8_t* b, int p, const int8_t* xq, const float* xd, int64_t blk, int cols, float (&acc)[NX]) {
    const float d = ld_f16(b);
    const float m = HasM ? ld_f16(b + L::m_at) : 0.0f;
    const uint32_t qh = HasQh ? ld_u32(b + L::qh_at) : 0;
    int lo[2], hi[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const uint32_t u = ld_u32(b + L::qs_at + 8 * p + 4 * k);
      uint32_t l = u & 0x0F0F0F0Fu, h = (u >> 4) & 0x0F0F0F0Fu;
      if constexpr (HasQh) {
        l |= spread_bits4(qh >> (8 * p + 4 * k));
        h |= spread_bits4(qh >> (16 + 8 * p + 4 * k));
      }
      if constexpr (!HasM) {
        constexpr uint32_t bias = (HasQh ? 16u : 8u) * 0x01010101u;
        l = __vsub4(l, bias);
        h = __vsub4(h, bias);
      }
      lo[k] = static_cast<int>(l);
      hi[k] = static_cast<int>(h);
    }
    const int n_sub = cols / k_qx;
#pragma unroll
    for (int r = 0; r < NX; ++r) {
      const int8_t* x = xq + static_cast<int64_t>(r) * cols + blk * 32 + 8 * p;
      int s = 0, sx = 0;
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int xl = ld_x4(x + 4 * k), xh = ld_x4(x + 16 + 4 * k);
        s = __dp4a(lo[k], xl, s);
        s = __dp4a(hi[k], xh, s);
        if constexpr (HasM) {
          sx = __dp4a(k_ones, xl, sx);
          sx = __dp4a(k_ones, xh, sx);
        }
      }
      const float xs = xd[static_cast<int64_t>(r) * n_sub + blk];
      if constexpr (HasM)
        acc[r] += xs * (d * static_cast<float>(s) + m * static_cast<float>(sx));
      else
        acc[r] += d * xs * static_cast<float>(s);
    }
  }
};
using q4_1_dot = legacy_dot<true, false>;
using q5_0_dot = legacy_dot<false, true>;
using q5_1_dot = legacy_dot<true, true>;

// Q4_K: part t (of 16) is chunk c = t/4, bytes l0 .. l0+7 of its 32 with l0 = 8*(t%4): low
// nibbles are codes 64c+l0.. of sub-block 2c, high nibbles codes 64c+32+l0.. of sub-block
// 2c+1 (as blk_q4_k). value = d*sc*q - dmin*m, so a sub-block adds
// xd * (d*sc * sum(q x) - dmin*m * sum(x)).
struct q4_k_dot {
  static constexpr int qk = 256, bytes = 144, lanes = 16;
  template <int NX>
  __device__ static void dot(const uint8_t* b, int t, const int8_t* xq, const float* xd, int64_t blk, int cols, float (&acc)[NX]) {
    const int c = t >> 2, l0 = 8 * (t & 3);
    float d0, o0, d1, o1;
    detail::k_chunk_scales(b, c, d0, o0, d1, o1);
    int lo[2], hi[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      const uint32_t u = ld_u32(b + 16 + 32 * c + l0 + 4 * k);
      lo[k] = static_cast<int>(u & 0x0F0F0F0Fu);
      hi[k] = static_cast<int>((u >> 4) & 0x0F0F0F0Fu);
    }
    const int n_sub = cols / k_qx;
#pragma unroll
    for (int r = 0; r < NX; ++r) {
      const int8_t* x = xq + static_cast<int64_t>(r) * cols + blk * 256 + 64 * c + l0;
      int sl = 0, sh = 0, ml = 0, mh = 0;
#pragma unroll
      for (int k = 0; k < 2; ++k) {
        const int xl = ld_x4(x + 4 * k), xh = ld_x4(x + 32 + 4 * k);
        sl = __dp4a(lo[k], xl, sl);
        ml = __dp4a(k_ones, xl, ml);
        sh = __dp4a(hi[k], xh, sh);
        mh = __dp4a(k_ones, xh, mh);
      }
      const float* s = xd + static_cast<int64_t>(r) * n_sub + blk * 8 + 2 * c;
      acc[r] +=
          s[0] * (d0 * static_cast<float>(sl) - o0 * static_cast<float>(ml)) + s[1] * (d1 * static_cast<float>(sh) - o1 * static_cast<float>(mh));
    }
  }
};

// Q6_K: part t (of 16) is half h = t/8, lanes l0 .. l0+3 with l0 = 4*(t%8); code k (0..3) of
// those lanes is element 128h + 32k + l0.., scaled by scales[8h + l0/16 + 2k] (as blk_q6_k).
// Codes are 6 bits (low 4 from ql, high 2 from qh) minus 32.
struct q6_k_dot {
  static constexpr int qk = 256, bytes = 210, lanes = 16;
  template <int NX>
  __device__ static void dot(const uint8_t* b, int t, const int8_t* xq, const float* xd, int64_t blk, int cols, float (&acc)[NX]) {
    const int h = t >> 3, l0 = 4 * (t & 7);
    const float d = ld_f16(b + 208);
    const uint32_t a = ld_u32(b + 64 * h + l0), a2 = ld_u32(b + 64 * h + 32 + l0);
    const uint32_t hh = ld_u32(b + 128 + 32 * h + l0);
    const uint8_t* sc = b + 192 + 8 * h + (l0 >> 4);
    const uint32_t code[4] = {(a & 0x0F0F0F0Fu) | ((hh << 4) & 0x30303030u), (a2 & 0x0F0F0F0Fu) | ((hh << 2) & 0x30303030u),
                              ((a >> 4) & 0x0F0F0F0Fu) | (hh & 0x30303030u), ((a2 >> 4) & 0x0F0F0F0Fu) | ((hh >> 2) & 0x30303030u)};
    int q[4];
    float ds[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      q[k] = static_cast<int>(__vsub4(code[k], 0x20202020u));
      ds[k] = d * static_cast<float>(static_cast<int8_t>(ld8(sc + 2 * k)));
    }
    const int n_sub = cols / k_qx;
#pragma unroll
    for (int r = 0; r < NX; ++r) {
      const int8_t* x = xq + static_cast<int64_t>(r) * cols + blk * 256 + 128 * h + l0;
      const float* s = xd + static_cast<int64_t>(r) * n_sub + blk * 8 + 4 * h;
#pragma unroll
      for (int k = 0; k < 4; ++k) acc[r] += ds[k] * s[k] * static_cast<float>(__dp4a(q[k], ld_x4(x + 32 * k), 0));
    }
  }
};

// One warp per 32 activations: scale amax / 127, codes x * (127 / amax) rounded to nearest
// even, as act_quant.cpp (1 / (amax / 127) would move codes at rounding boundaries). A NaN
// among the 32 makes the scale NaN, so it reaches the outputs as the f32 matvec's would,
// instead of vanishing into fmaxf and a zero code.
__global__ void quantize_kernel(const float* __restrict__ x, int64_t n_blocks, int8_t* __restrict__ xq, float* __restrict__ xd) {
  const int64_t blk = static_cast<int64_t>(blockIdx.x) * k_warps + threadIdx.x / k_warp;
  if (blk >= n_blocks) return;  // whole warps only
  const int lane = threadIdx.x % k_warp;
  const float v = x[blk * k_qx + lane];
  float amax = fabsf(v);
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
  const bool nan = __any_sync(0xffffffffu, isnan(v));
  const float id = amax != 0.0f && !nan ? 127.0f / amax : 0.0f;
  xq[blk * k_qx + lane] = static_cast<int8_t>(__float2int_rn(v * id));
  if (lane == 0) xd[blk] = nan ? __int_as_float(0x7fc00000) : amax / 127.0f;
}

template <class B, int NX>
__global__ void __launch_bounds__(k_threads)
    matvec_q8_kernel(const uint8_t* __restrict__ w, int64_t row_bytes, int n_items, int cols, const int8_t* __restrict__ xq,
                     const float* __restrict__ xd, int rows, float* __restrict__ y) {
  static_assert(k_threads % B::lanes == 0, "a thread's part must not change between iterations");
  const int o = blockIdx.x;
  const uint8_t* row = w + static_cast<int64_t>(o) * row_bytes;
  const int part = threadIdx.x % B::lanes;

  float acc[NX];
#pragma unroll
  for (int r = 0; r < NX; ++r) acc[r] = 0.0f;
#pragma unroll 2
  for (int it = threadIdx.x; it < n_items; it += k_threads) {
    const int64_t blk = it / B::lanes;
    B::template dot<NX>(row + blk * B::bytes, part, xq, xd, blk, cols, acc);
  }

  detail::cta_sum_store(acc, y, rows, o);
}

template <class B, int NX>
void launch(const void* w, int64_t rows, int64_t cols, const int8_t* xq, const float* xd, float* y, stream_t s) {
  const int64_t n_blocks = cols / B::qk;
  matvec_q8_kernel<B, NX><<<static_cast<unsigned>(rows), k_threads, 0, s>>>(static_cast<const uint8_t*>(w), n_blocks * B::bytes,
                                                                            static_cast<int>(n_blocks * B::lanes), static_cast<int>(cols), xq, xd,
                                                                            static_cast<int>(rows), y);
}

template <class B>
void launch_nx(const void* w, int64_t rows, int64_t cols, const int8_t* xq, const float* xd, int64_t n_x, float* y, stream_t s) {
  detail::dispatch_rows(n_x, [&](auto nx) { launch<B, decltype(nx)::value>(w, rows, cols, xq, xd, y, s); });
}

}  // namespace

bool matvec_q8_supports(weight_type wt) {
  switch (wt) {
    case weight_type::q8_0:
    case weight_type::q4_0:
    case weight_type::q4_1:
    case weight_type::q5_0:
    case weight_type::q5_1:
    case weight_type::q4_k:
    case weight_type::q6_k:
      return true;
    default:
      return false;
  }
}

size_t matvec_q8_scratch_bytes(int64_t cols, int64_t n_x) {
  if (cols < 0 || n_x < 0) throw std::invalid_argument("cuda matvec_q8: negative shape");
  const size_t values = static_cast<size_t>(n_x) * static_cast<size_t>(cols);
  return round_up(values) + round_up(values / k_qx * sizeof(float));
}

namespace {

// The host-side checks quantize_q8 and matvec_q8_quantized share, naming `what`.
void check_rows(const char* what, int64_t n_x) {
  if (n_x < 0 || n_x > k_matvec_max_rows)
    throw std::invalid_argument(std::string("cuda ") + what + ": n_x " + std::to_string(n_x) + " outside 0.." + std::to_string(k_matvec_max_rows));
}
void check_scratch(const char* what, int64_t cols, int64_t n_x, const void* scratch, size_t scratch_size) {
  const size_t need = matvec_q8_scratch_bytes(cols, n_x);
  if (scratch_size < need)
    throw std::invalid_argument(std::string("cuda ") + what + ": scratch of " + std::to_string(scratch_size) + " bytes, needs " +
                                std::to_string(need));
  if (reinterpret_cast<uintptr_t>(scratch) % 16 != 0) throw std::invalid_argument(std::string("cuda ") + what + ": unaligned scratch");
}
void require_q8(weight_type wt) {
  require(device_kind::cuda, op::matvec, wt);
  if (!matvec_q8_supports(wt))
    throw std::invalid_argument("cuda matvec_q8: no integer kernel for " + display_name(wt) +
                                " (supported: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K)");
}
// The scales follow the codes in the scratch (see the top of this file).
size_t scales_offset(int64_t cols, int64_t n_x) { return round_up(static_cast<size_t>(n_x * cols)); }

}  // namespace

void quantize_q8(const float* x, int64_t n_x, int64_t cols, void* scratch, size_t scratch_size, stream_t s) {
  check_rows("quantize_q8", n_x);
  if (cols < 0 || cols > INT_MAX || cols % k_qx != 0)
    throw std::invalid_argument("cuda quantize_q8: cols " + std::to_string(cols) + " is not a multiple of 32");
  check_scratch("quantize_q8", cols, n_x, scratch, scratch_size);
  if (n_x == 0 || cols == 0) return;
  auto* xq = static_cast<int8_t*>(scratch);
  auto* xd = reinterpret_cast<float*>(static_cast<uint8_t*>(scratch) + scales_offset(cols, n_x));
  const int64_t n_blocks = n_x * cols / k_qx;
  const int64_t grid = (n_blocks + k_warps - 1) / k_warps;
  quantize_kernel<<<static_cast<unsigned>(grid), k_threads, 0, s>>>(x, n_blocks, xq, xd);
  check_last("quantize_q8");
}

void matvec_q8_quantized(weight_type wt, const void* w, int64_t rows, int64_t cols, const void* xq_scratch, size_t scratch_size, int64_t n_x,
                         float* y, stream_t s) {
  require_q8(wt);
  check_rows("matvec_q8", n_x);
  if (rows < 0 || rows > INT_MAX || cols > INT_MAX)
    throw std::invalid_argument("cuda matvec_q8: " + std::to_string(rows) + " x " + std::to_string(cols) + " is out of range");
  detail::check_blocks("matvec_q8", wt, "cols", cols);
  detail::check_aligned("matvec_q8", w);
  check_scratch("matvec_q8", cols, n_x, xq_scratch, scratch_size);
  if (n_x == 0 || rows == 0) return;
  const auto* xq = static_cast<const int8_t*>(xq_scratch);
  const auto* xd = reinterpret_cast<const float*>(static_cast<const uint8_t*>(xq_scratch) + scales_offset(cols, n_x));
  switch (wt) {
    case weight_type::q8_0:
      launch_nx<q8_0_dot>(w, rows, cols, xq, xd, n_x, y, s);
      break;
    case weight_type::q4_0:
      launch_nx<q4_0_dot>(w, rows, cols, xq, xd, n_x, y, s);
      break;
    case weight_type::q4_1:
      launch_nx<q4_1_dot>(w, rows, cols, xq, xd, n_x, y, s);
      break;
    case weight_type::q5_0:
      launch_nx<q5_0_dot>(w, rows, cols, xq, xd, n_x, y, s);
      break;
    case weight_type::q5_1:
      launch_nx<q5_1_dot>(w, rows, cols, xq, xd, n_x, y, s);
      break;
    case weight_type::q4_k:
      launch_nx<q4_k_dot>(w, rows, cols, xq, xd, n_x, y, s);
      break;
    case weight_type::q6_k:
      launch_nx<q6_k_dot>(w, rows, cols, xq, xd, n_x, y, s);
      break;
    default:
      break;  // ruled out above
  }
  check_last("matvec_q8");
}

void matvec_q8(weight_type wt, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n_x, float* y, void* scratch, size_t scratch_size,
               stream_t s) {
  // The weight checks first, so that a refused call does no work.
  require_q8(wt);
  detail::check_blocks("matvec_q8", wt, "cols", cols);
  quantize_q8(x, n_x, cols, scratch, scratch_size, s);
  matvec_q8_quantized(wt, w, rows, cols, scratch, scratch_size, n_x, y, s);
}

}  // namespace tandem::kernels::cuda
