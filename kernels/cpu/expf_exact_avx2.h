// e^x on 8 floats with the same bits as the C library's expf: expf_exact_avx512.h's method
// (each lane in double precision, rounded to float; lanes near a rounding midpoint, outside
// [-87, 88], inf and NaN call expf itself) on AVX2 registers, 4 doubles each. Include it only
// from files compiled with the AVX2 flags; everything is static, as in simd_avx2.h.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>

namespace tandem::kernels::cpu::avx2 {

// e^x for 4 doubles holding floats in [-87, 88] (avx512::exp_pd_near takes a table of 2^(j/16)
// instead of the series to r^10; no measured reason to change this one). AVX2 has no scalef:
// 2^n is built from its exponent bits, and the product with e^r is exact (a power of two times
// a double in [0.7, 1.5], normal for every n here), so it equals scalef's result.
static inline __m256d exp_pd_near(__m256d x) {
  const __m256d n = _mm256_round_pd(_mm256_mul_pd(x, _mm256_set1_pd(1.4426950408889634)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
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
  const __m256 in_range = _mm256_and_ps(_mm256_cmp_ps(x, _mm256_set1_ps(-87.0f), _CMP_GE_OQ),
                                        _mm256_cmp_ps(x, _mm256_set1_ps(88.0f), _CMP_LE_OQ));
  const __m256 xs = _mm256_and_ps(x, in_range);  // out-of-range lanes: e^0, replaced below
  const __m256d ylo = exp_pd_near(_mm256_cvtps_pd(_mm256_castps256_ps128(xs)));
  const __m256d yhi = exp_pd_near(_mm256_cvtps_pd(_mm256_extractf128_ps(xs, 1)));
  __m256 y = _mm256_insertf128_ps(_mm256_castps128_ps256(_mm256_cvtpd_ps(ylo)), _mm256_cvtpd_ps(yhi), 1);
  const unsigned slow = static_cast<unsigned>(near_midpoint(ylo) | near_midpoint(yhi) << 4) |
                        (~static_cast<unsigned>(_mm256_movemask_ps(in_range)) & 0xFFu);
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
