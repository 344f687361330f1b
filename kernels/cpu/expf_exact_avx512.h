// e^x on 16 floats with the same bits as the C library's expf, for the kernels whose contract
// names expf (the llama.cpp-compatible attention and SwiGLU). Include it only from files
// compiled with the AVX-512 flags; everything is static, as in simd_avx512.h.
//
// Each lane is computed in double precision (relative error under 2^-42) and rounded to float,
// which is the correctly rounded result unless the double lies close to the midpoint between
// two floats. glibc's expf is correctly rounded outside that band too: it also works in
// double, with a documented error before rounding of 1.69 * 2^-34 relative, under 2^-9 of a
// float ulp. So lanes farther than 2^-8 ulp from a midpoint take the vector result, and the
// rest (about 1 in 128), with every lane outside [-87, 88] (where results approach the ends
// of the normal floats), inf and NaN, call expf itself. Every float in [-104, 89] was
// compared against Debian 12's glibc: equal with this band and with 2^-9; 18,551 differ with
// 2^-10, and 170,489 with no band at all (glibc rounds those the other way). The unit test
// (tests/kernels/ops_avx512_test.cpp) checks a stride of them.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>

namespace tandem::kernels::cpu::avx512 {

// e^x for 8 doubles holding floats in [-87, 88]: x = k ln2 / 16 + r with k = 16n + j and
// |r| <= ln2 / 32, so e^x = 2^n * 2^(j / 16) * e^r: 2^(j / 16) from a table of 16 doubles (one
// two-register permute), e^r by its Taylor series to r^5 (truncation under 2^-42 relative,
// 2^-19 of a float ulp: far inside the 2^-8 ulp band below). Against the table-free series to
// r^10 this was, the dependent chain is 5 multiply-adds instead of 10.
static inline __m512d exp_pd_near(__m512d x) {
  const __m512d k = _mm512_maskz_roundscale_pd(0xFF, _mm512_mul_pd(x, _mm512_set1_pd(16 * 1.4426950408889634)),
                                               _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  // ln 2 / 16 as a double plus the part a double cannot hold.
  __m512d r = _mm512_fnmadd_pd(k, _mm512_set1_pd(0x1.62e42fefa39efp-5), x);
  r = _mm512_fnmadd_pd(k, _mm512_set1_pd(0x1.abc9e3b39803fp-60), r);
  __m512d p = _mm512_set1_pd(1.0 / 120);
  p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 24));
  p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0 / 6));
  p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(0.5));
  p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0));
  p = _mm512_fmadd_pd(p, r, _mm512_set1_pd(1.0));
  // j = k mod 16: k + 1.5 * 2^52 holds k in its low mantissa bits (two's complement below
  // zero), and the permute reads the low 4 bits of each lane.
  const __m512i j = _mm512_castpd_si512(_mm512_add_pd(k, _mm512_set1_pd(0x1.8p52)));
  const __m512d lo = _mm512_setr_pd(0x1.0000000000000p+0, 0x1.0b5586cf9890fp+0, 0x1.172b83c7d517bp+0, 0x1.2387a6e756238p+0,
                                    0x1.306fe0a31b715p+0, 0x1.3dea64c123422p+0, 0x1.4bfdad5362a27p+0, 0x1.5ab07dd485429p+0);
  const __m512d hi = _mm512_setr_pd(0x1.6a09e667f3bcdp+0, 0x1.7a11473eb0187p+0, 0x1.8ace5422aa0dbp+0, 0x1.9c49182a3f090p+0,
                                    0x1.ae89f995ad3adp+0, 0x1.c199bdd85529cp+0, 0x1.d5818dcfba487p+0, 0x1.ea4afa2a490dap+0);
  const __m512d t = _mm512_permutex2var_pd(lo, j, hi);
  // 2^floor(k / 16) = 2^n: scalef takes the floor of its exponent operand.
  return _mm512_maskz_scalef_pd(0xFF, _mm512_mul_pd(p, t), _mm512_mul_pd(k, _mm512_set1_pd(1.0 / 16)));
}

// Lanes of y (doubles about to be rounded to float) within 2^-8 float ulp of a midpoint: the
// 29 fraction bits below a float's 23 sit within 2^21 of 2^28.
static inline __mmask8 near_midpoint(__m512d y) {
  const __m512i low = _mm512_and_si512(_mm512_castpd_si512(y), _mm512_set1_epi64((int64_t{1} << 29) - 1));
  const __m512i off = _mm512_maskz_abs_epi64(0xFF, _mm512_sub_epi64(low, _mm512_set1_epi64(int64_t{1} << 28)));
  return _mm512_cmplt_epi64_mask(off, _mm512_set1_epi64(int64_t{1} << 21));
}

static inline __m512 expf_exact(__m512 x) {
  // Lanes in [-87, 88] (NaN fails both compares) have a normal float result.
  const __mmask16 in_range = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ) &
                             _mm512_cmp_ps_mask(x, _mm512_set1_ps(88.0f), _CMP_LE_OQ);
  const __m512 xs = _mm512_maskz_mov_ps(in_range, x);  // out-of-range lanes: e^0, replaced below
  const __m256 lo8 = _mm512_mask_extractf32x8_ps(_mm256_setzero_ps(), 0xFF, xs, 0);
  const __m256 hi8 = _mm512_mask_extractf32x8_ps(_mm256_setzero_ps(), 0xFF, xs, 1);
  const __m512d ylo = exp_pd_near(_mm512_maskz_cvtps_pd(0xFF, lo8));
  const __m512d yhi = exp_pd_near(_mm512_maskz_cvtps_pd(0xFF, hi8));
  const __mmask16 hard = static_cast<__mmask16>(near_midpoint(ylo) | (static_cast<unsigned>(near_midpoint(yhi)) << 8));
  __m512 y = _mm512_insertf32x8(_mm512_castps256_ps512(_mm512_maskz_cvtpd_ps(0xFF, ylo)), _mm512_maskz_cvtpd_ps(0xFF, yhi), 1);
  const unsigned slow = static_cast<unsigned>(hard) | static_cast<unsigned>(static_cast<__mmask16>(~in_range));
  if (slow != 0) {
    alignas(64) float xv[16], yv[16];
    _mm512_store_ps(xv, x);
    _mm512_store_ps(yv, y);
    for (unsigned m = slow; m != 0; m &= m - 1) {
      const int i = __builtin_ctz(m);
      yv[i] = std::exp(xv[i]);
    }
    y = _mm512_load_ps(yv);
  }
  return y;
}

}  // namespace tandem::kernels::cpu::avx512
