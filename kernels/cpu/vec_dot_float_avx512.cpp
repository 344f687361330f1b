// AVX-512 dots for F32, F16 and BF16 weights (activations in the same format), as tiles of
// NW weight rows x NR activation rows: each 64-byte slice of a weight row is loaded and
// widened once for all NR activation rows, and each activation slice once for all NW weight
// rows. A row length that is not a multiple of the slice ends with one masked (zero-filled)
// slice.
#include <immintrin.h>

#include "kernels/cpu/packed.h"
#include "kernels/cpu/simd_avx512.h"
#include "kernels/cpu/vec_dot.h"

namespace tandem::kernels::cpu {
namespace {

using namespace avx512;

// Per format: a slice is the elements in 64 bytes of a row (one cache line when aligned),
// as the operand of madd, loaded whole or as its first k elements (zeros after them).
struct f32_format {
  static constexpr int64_t width = 16;
  static constexpr size_t bytes = 4;
  using slice = __m512;
  static slice load(const uint8_t* p) { return _mm512_loadu_ps(p); }
  static slice load_first(const uint8_t* p, int64_t k) { return _mm512_maskz_loadu_ps(first16(k), p); }
  static __m512 madd(__m512 acc, slice w, slice a) { return _mm512_fmadd_ps(w, a, acc); }
};

// fp16 x fp16 products are exact in float, so each FMA rounds once per element, like the
// scalar reference's float product summed in double up to the accumulation order.
struct f16_format {
  static constexpr int64_t width = 32;
  static constexpr size_t bytes = 2;
  struct slice {
    __m512 lo, hi;
  };
  static slice load(const uint8_t* p) { return {cvt_f16(load32(p)), cvt_f16(load32(p + 32))}; }
  static slice load_first(const uint8_t* p, int64_t k) {
    const __m512i h = _mm512_maskz_loadu_epi16(first32(k), p);
    return {cvt_f16(low_half(h)), cvt_f16(high_half(h))};
  }
  static __m512 madd(__m512 acc, const slice& w, const slice& a) {
    return _mm512_fmadd_ps(w.hi, a.hi, _mm512_fmadd_ps(w.lo, a.lo, acc));
  }
};

// vdpbf16ps: lane i gains w[2i] * a[2i] + w[2i+1] * a[2i+1].
struct bf16_format {
  static constexpr int64_t width = 32;
  static constexpr size_t bytes = 2;
  using slice = __m512bh;
  static slice load(const uint8_t* p) { return reinterpret_cast<__m512bh>(load64(p)); }
  static slice load_first(const uint8_t* p, int64_t k) {
    return reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(first32(k), p));
  }
  static __m512 madd(__m512 acc, slice w, slice a) { return _mm512_dpbf16_ps(acc, w, a); }
};

// How many tiles ahead the L2 requests go (an Intel Xeon's F16 decode ran ~11% faster with
// them; 2, 4 and 8 tiles measured alike).
constexpr size_t k_far_tiles = 4;

template <class Fmt, int NW, int NR>
void tile(int64_t n, const uint8_t* w, size_t w_stride, const uint8_t* act, size_t act_stride, float* out,
          int64_t out_stride) {
  static_assert(Fmt::width * Fmt::bytes == 64);
  __m512 acc[NW][NR];
  TANDEM_UNROLL
  for (int o = 0; o < NW; ++o)
    TANDEM_UNROLL
    for (int r = 0; r < NR; ++r) acc[o][r] = _mm512_setzero_ps();
  // Where the CPU's own prefetchers do not keep up (not AMD: packed.h), the same lines
  // k_far_tiles tiles on are asked into L2 as well, as the packed kernels ask.
  const bool far = !g_packed_self_streaming;
  auto step = [&](int64_t i, auto load) {
    typename Fmt::slice ws[NW];
    TANDEM_UNROLL
    for (int o = 0; o < NW; ++o) ws[o] = load(w + o * w_stride + i * Fmt::bytes);
    TANDEM_UNROLL
    for (int r = 0; r < NR; ++r) {
      const typename Fmt::slice as = load(act + r * act_stride + i * Fmt::bytes);
      TANDEM_UNROLL
      for (int o = 0; o < NW; ++o) acc[o][r] = Fmt::madd(acc[o][r], ws[o], as);
    }
  };
  int64_t i = 0;
  for (; i + Fmt::width <= n; i += Fmt::width) {
    // The same line of the NW rows after the tile, which matmul reads next: the hardware
    // prefetchers lose track of the tile's interleaved row streams (see the legacy dots).
    TANDEM_UNROLL
    for (int o = 0; o < NW; ++o)
      prefetch(w + o * w_stride + i * Fmt::bytes, NW * w_stride);
    if (far) {
      TANDEM_UNROLL
      for (int o = 0; o < NW; ++o) prefetch_l2(w + o * w_stride + i * Fmt::bytes, k_far_tiles * NW * w_stride);
    }
    step(i, [](const uint8_t* p) { return Fmt::load(p); });
  }
  if (i < n) step(i, [k = n - i](const uint8_t* p) { return Fmt::load_first(p, k); });
  store_tile<NW, NR>(acc, out, out_stride);
}

template <class Fmt>
void dot_float(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride, int n_act,
               float* out, int64_t out_stride) {
  with_tile(n_w, n_act, [&]<int NW, int NR>() {
    tile<Fmt, NW, NR>(n, static_cast<const uint8_t*>(w), w_stride, static_cast<const uint8_t*>(act), act_stride, out,
                      out_stride);
  });
}

}  // namespace

void dot_f32_avx512(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride,
                    int n_act, float* out, int64_t out_stride) {
  dot_float<f32_format>(n, w, w_stride, n_w, act, act_stride, n_act, out, out_stride);
}

void dot_f16_avx512(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride,
                    int n_act, float* out, int64_t out_stride) {
  dot_float<f16_format>(n, w, w_stride, n_w, act, act_stride, n_act, out, out_stride);
}

void dot_bf16_avx512(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride,
                     int n_act, float* out, int64_t out_stride) {
  dot_float<bf16_format>(n, w, w_stride, n_w, act, act_stride, n_act, out, out_stride);
}

}  // namespace tandem::kernels::cpu
