// AVX2 building blocks shared by the *_avx2.cpp kernels. Include it only from files compiled
// with -mavx2 -mfma -mf16c (kernels/CMakeLists.txt does that for *_avx2.cpp). Everything is
// `static` (internal linkage) so no AVX2-encoded copy can be merged into baseline code; for
// the same reason the *_avx2.cpp files avoid out-of-line standard library templates.
#pragma once

#include <immintrin.h>

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
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3, 3, 3, 3, 3, 3, 3, 3));
  const __m256i mask = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, mask), mask);
  return _mm256_and_si256(set, _mm256_set1_epi8(0x10));
}

// Eight int32 partial sums of u[i] * s[i] for unsigned codes u (< 128) and signed s. Pair
// sums stay below the int16 saturation bound for |s| <= 127 and u <= 127.
static inline __m256i dot_u8_i8(__m256i u, __m256i s) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1));
}

// Same with a per-pair 16-bit multiplier (sub-block scales) folded into the widening step.
static inline __m256i dot_u8_i8_scaled(__m256i u, __m256i s, __m256i scale16) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), scale16);
}

// Signed x signed: maddubs wants an unsigned operand, so move x's sign onto s.
// `abs_x` is _mm256_sign_epi8(x, x), computed once per weight block by the caller.
static inline __m256i dot_i8_i8(__m256i x, __m256i abs_x, __m256i s) { return dot_u8_i8(abs_x, _mm256_sign_epi8(s, x)); }

// Calls f.template operator()<NR>() with NR = n (1..4) as a compile-time constant, so the
// per-row accumulators live in registers.
template <class F>
static inline void with_rows(int n, F&& f) {
  switch (n) {
    case 1: f.template operator()<1>(); break;
    case 2: f.template operator()<2>(); break;
    case 3: f.template operator()<3>(); break;
    default: f.template operator()<4>(); break;
  }
}

}  // namespace tandem::kernels::cpu::avx2
