// AVX2 math for the attention and element-wise *_avx2.cpp kernels: f16 conversions and
// rounding through F16C, a vector e^x, masks for row tails. Include it only from files compiled
// with at least -mavx2 -mfma -mf16c. Everything is `static inline`, as in simd_avx2.h, so no
// AVX2-encoded copy can be merged into baseline code.
#pragma once

#include <immintrin.h>

#include <cstdint>

namespace tandem::kernels::cpu::avx2 {

// Eight f16 values -> floats (exact).
static inline __m256 load_f16x8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Floats -> nearest f16, ties to even (as the scalar fp32_to_fp16), stored as 8 halves.
static inline void store_f16x8(uint16_t* p, __m256 x) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT));
}

// x rounded to the nearest f16 value and widened back: what an f16 variable would hold.
static inline __m256 round_f16(__m256 x) { return _mm256_cvtph_ps(_mm256_cvtps_ph(x, _MM_FROUND_TO_NEAREST_INT)); }

// All-ones in the first n lanes (0 <= n <= 8), for maskload/maskstore of a row's tail.
static inline __m256i first_lanes(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// e^x in every lane, within 2 ulp of the exact value (0.9 ulp measured against double over the
// float range by tests/kernels/softmax_test.cpp).
// x = n ln2 + r with |r| <= ln2/2 (the product n ln2 in two parts, so r is exact to float
// precision for every n the clamp allows), e^r from its Taylor series to r^7 (the r^8 term is
// below 1e-8 relative), then scaled by 2^n. The scale is applied as two powers of two, each a
// normal float, so results down in the subnormal range (n to -150) are rounded once and
// correctly. Overflow gives +inf, underflow 0, NaN stays NaN: the clamps keep a NaN lane
// because min/max return their second operand when either one is NaN.
static inline __m256 exp_ps(__m256 x) {
  x = _mm256_min_ps(_mm256_set1_ps(89.0f), x);    // e^89 > FLT_MAX: still +inf after scaling
  x = _mm256_max_ps(_mm256_set1_ps(-104.0f), x);  // e^-104 < half the smallest subnormal: 0
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);  // high part: exact product
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.42860676533018704e-6f), r);     // ln2 - high part
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

}  // namespace tandem::kernels::cpu::avx2
