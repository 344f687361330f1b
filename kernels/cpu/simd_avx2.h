// AVX2 building blocks shared by the *_avx2.cpp kernels (and the attention kernel's AVX-512
// build): block decoding and integer dots, f16 conversions and masks, a vector e^x, an expf
// with the C library's bits, and the barrier against fused multiply-adds. Include it only from
// files compiled with at least -mavx2 -mfma -mf16c (kernels/CMakeLists.txt does that for
// *_avx2.cpp). Everything is `static` (internal linkage) so no AVX2-encoded copy can be merged
// into baseline code; for the same reason the *_avx2.cpp files avoid out-of-line standard
// library templates.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/blocks.h"

// As in simd_avx512.h: unrolled, per-row accumulators stay in registers.
#ifndef TANDEM_UNROLL
#define TANDEM_UNROLL _Pragma("GCC unroll 16")
#endif

namespace tandem::kernels::cpu::avx2 {

static inline float half_to_float(const half_bytes& h) { return _cvtsh_ss(load_half(h)); }

static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

static inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// 16 bytes of packed nibbles -> 32 bytes: low nibbles in bytes 0..15, high nibbles in 16..31
// (the element order of every legacy 4/5-bit block).
static inline __m256i unpack_nibbles(const uint8_t* qs) {
  const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m256i both = _mm256_set_m128i(_mm_srli_epi16(packed, 4), packed);
  return _mm256_and_si256(both, _mm256_set1_epi8(0x0F));
}

// Bit j of the little-endian 32-bit word at `p` -> byte j = 0x10 if set, else 0.
static inline __m256i fifth_bits(const uint8_t* p) {
  uint32_t bits;
  std::memcpy(&bits, p, sizeof bits);
  // Byte j of the result looks at source byte j / 8, then tests bit j % 8 of it.
  const __m256i spread =
      _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(bits)),
                          _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i mask = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

// Eight int32 partial sums of u[i] * s[i] for unsigned codes u (< 128) and signed s. Pair
// sums stay below the int16 saturation bound for |s| <= 127 and u <= 127.
static inline __m256i dot_u8_i8(__m256i u, __m256i s) { return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)); }

// Same with a per-pair 16-bit multiplier (sub-block scales) folded into the widening step.
static inline __m256i dot_u8_i8_scaled(__m256i u, __m256i s, __m256i scale16) { return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), scale16); }

// Signed x signed: maddubs wants an unsigned operand, so move x's sign onto s.
// `abs_x` is _mm256_sign_epi8(x, x), computed once per weight block by the caller.
static inline __m256i dot_i8_i8(__m256i x, __m256i abs_x, __m256i s) { return dot_u8_i8(abs_x, _mm256_sign_epi8(s, x)); }

// Calls f.template operator()<NR>() with NR = n (1..4) as a compile-time constant, so the
// per-row accumulators live in registers.
template <class F>
static inline void with_rows(int n, F&& f) {
  switch (n) {
    case 1:
      f.template operator()<1>();
      break;
    case 2:
      f.template operator()<2>();
      break;
    case 3:
      f.template operator()<3>();
      break;
    default:
      f.template operator()<4>();
      break;
  }
}

// f16 conversions and rounding through F16C, masks for row tails, a vector e^x (the attention
// and element-wise kernels).

// Eight f16 values -> floats (exact).
static inline __m256 load_f16x8(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }

// Floats -> nearest f16, ties to even (as the scalar fp32_to_fp16), stored as 8 halves.
static inline void store_f16x8(uint16_t* p, __m256 x) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
}

// x rounded to the nearest f16 value and widened back: what an f16 variable would hold.
static inline __m256 round_f16(__m256 x) { return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT)); }

// All-ones in the first n lanes (0 <= n <= 8), for maskload/maskstore of a row's tail.
static inline __m256i first_lanes(int n) { return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7)); }

// e^x in every lane, within 2 ulp of the exact value (0.9 ulp measured against double over the
// float range by tests/kernels/ops_test.cpp).
// x = n ln2 + r with |r| <= ln2/2 (the product n ln2 in two parts, so r is exact to float
// precision for every n the clamp allows), e^r from its Taylor series to r^7 (the r^8 term is
// below 1e-8 relative), then scaled by 2^n. The scale is applied as two powers of two, each a
// normal float, so results down in the subnormal range (n to -150) are rounded once and
// correctly. Overflow gives +inf, underflow 0, NaN stays NaN: the clamps keep a NaN lane
// because min/max return their second operand when either one is NaN.
static inline __m256 exp_ps(__m256 x) {
  x = _mm256_min_ps(_mm256_set1_ps(89.0f), x);    // e^89 > FLT_MAX: still +inf after scaling
  x = _mm256_max_ps(_mm256_set1_ps(-104.0f), x);  // e^-104 < half the smallest subnormal: 0
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);  // high part: exact product
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860676533018704e-6f), r);    // ln2 - high part
  __m256 p = _mm256_set1_ps(1.0f / 5040.0f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
  const __m256i ni = _mm256_cvtps_epi32(n);  // -150 .. 128
  const __m256i n1 = _mm256_srai_epi32(ni, 1);
  const __m256i n2 = _mm256_sub_epi32(ni, n1);  // n1, n2 in -75 .. 64
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

// e^x on 8 floats with the same bits as the C library's expf: avx512::expf_exact's method
// (simd_avx512.h: each lane in double precision, rounded to float; lanes near a rounding
// midpoint, outside [-87, 88], inf and NaN call expf itself) on AVX2 registers, 4 doubles each.

// e^x for 4 doubles holding floats in [-87, 88] (avx512::exp_pd_near takes a table of 2^(j/16)
// instead of the series to r^10; no measured reason to change this one). AVX2 has no scalef:
// 2^n is built from its exponent bits, and the product with e^r is exact (a power of two times
// a double in [0.7, 1.5], normal for every n here), so it equals scalef's result.
static inline __m256d exp_pd_near(__m256d x) {
  const __m256d n = _mm256_round_pd(_mm256_mul_pd(x, _mm256_set1_pd(1.4426950408889634)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // ln 2 as a double plus the part a double cannot hold.
  __m256d r = _mm256_fnmadd_pd(n, _mm256_set1_pd(0x1.62e42fefa39efp-1), x);
  r = _mm256_fnmadd_pd(n, _mm256_set1_pd(0x1.abc9e3b39803fp-56), r);
  // Estrin's scheme rather than Horner's: 5 dependent steps instead of 10 (swiglu on a Zen 2:
  // 2.9 -> 2.2 ns an element; the scalar loop with expf takes 4.1). Its rounding differs from
  // Horner's by a few double ulps, far inside the band: every float in [-104, 89] was checked.
  auto c = [](double v) { return _mm256_set1_pd(v); };
  const __m256d r2 = _mm256_mul_pd(r, r), r4 = _mm256_mul_pd(r2, r2);
  const __m256d p01 = _mm256_fmadd_pd(r, c(1.0), c(1.0)), p23 = _mm256_fmadd_pd(r, c(1.0 / 6), c(1.0 / 2));
  const __m256d p45 = _mm256_fmadd_pd(r, c(1.0 / 120), c(1.0 / 24)), p67 = _mm256_fmadd_pd(r, c(1.0 / 5040), c(1.0 / 720));
  const __m256d p89 = _mm256_fmadd_pd(r, c(1.0 / 362880), c(1.0 / 40320));
  const __m256d p03 = _mm256_fmadd_pd(p23, r2, p01), p47 = _mm256_fmadd_pd(p67, r2, p45);
  const __m256d p8a = _mm256_fmadd_pd(c(1.0 / 3628800), r2, p89);
  const __m256d p = _mm256_fmadd_pd(_mm256_fmadd_pd(p8a, r4, p47), r4, p03);
  // The bits of n + 1.5 * 2^52 end in 2^51 + n (n is an integer in [-126, 127]); their low 12
  // bits plus the bias are n + 1023, which the shift moves into the exponent field, dropping
  // 2^51 and the sum's own exponent.
  const __m256i nbits = _mm256_castpd_si256(_mm256_add_pd(n, _mm256_set1_pd(0x1.8p52)));
  const __m256i two_n = _mm256_slli_epi64(_mm256_add_epi64(nbits, _mm256_set1_epi64x(1023)), 52);
  return _mm256_mul_pd(p, _mm256_castsi256_pd(two_n));
}

// Bit i set for the lanes of y (doubles about to be rounded to float) within 2^-8 float ulp of
// a midpoint: the 29 fraction bits below a float's 23 sit within 2^21 of 2^28.
static inline int near_midpoint(__m256d y) {
  const __m256i low = _mm256_and_si256(_mm256_castpd_si256(y), _mm256_set1_epi64x((int64_t{1} << 29) - 1));
  const __m256i off = _mm256_sub_epi64(low, _mm256_set1_epi64x(int64_t{1} << 28));
  const __m256i near = _mm256_and_si256(_mm256_cmpgt_epi64(off, _mm256_set1_epi64x(-(int64_t{1} << 21))),
                                        _mm256_cmpgt_epi64(_mm256_set1_epi64x(int64_t{1} << 21), off));
  return _mm256_movemask_pd(_mm256_castsi256_pd(near));
}

static inline __m256 expf_exact(__m256 x) {
  // Lanes in [-87, 88] (NaN fails both compares) have a normal float result.
  const __m256 in_range = _mm256_and_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ), _mm256_cmp_ps(x, _mm256_set1_ps(88.0f), _CMP_LE_OQ));
  const __m256 xs = _mm256_and_ps(x, in_range);  // out-of-range lanes: e^0, replaced below
  const __m256d ylo = exp_pd_near(_mm256_cvtps_pd(_mm256_castps256_ps128(xs)));
  const __m256d yhi = exp_pd_near(_mm256_cvtps_pd(_mm256_extractf128_ps(xs, 1)));
  __m256 y = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm256_cvtpd_ps(ylo)), _mm256_cvtpd_ps(yhi), 1);
  const unsigned slow =
      static_cast<unsigned>(near_midpoint(ylo) | near_midpoint(yhi) << 4) | (~static_cast<unsigned>(_mm256_movemask_ps(in_range)) & 0xFFu);
  if (slow != 0) {
    alignas(32) float xv[8], yv[8];
    _mm256_store_ps(xv, x);
    _mm256_store_ps(yv, y);
    for (unsigned m = slow; m != 0; m &= m - 1) {
      const int i = __builtin_ctz(m);
      yv[i] = std::exp(xv[i]);
    }
    y = _mm256_load_ps(yv);
  }
  return y;
}

}  // namespace tandem::kernels::cpu::avx2

namespace tandem::kernels::cpu {
namespace {

// A barrier against floating-point contraction for the kernels whose results must keep the
// bits of separate multiplies and adds (llama.cpp's, or the scalar reference's) although
// their files are built with -mfma: the asm claims to change x, so the product that made it
// cannot be merged with the add it feeds into one fused multiply-add. It costs no
// instruction. For float, __m128 and __m256 (the "x" constraint: xmm/ymm registers).
template <class V>
static inline V unfused(V x) {
  asm("" : "+x"(x));
  return x;
}

}  // namespace
}  // namespace tandem::kernels::cpu
