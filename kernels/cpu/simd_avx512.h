// AVX-512 building blocks shared by the *_avx512.cpp kernels. Include it only from files
// compiled with the AVX-512 flags (kernels/CMakeLists.txt sets them for *_avx512.cpp).
// Everything is `static` (internal linkage) for the same reason as in simd_avx2.h: no
// AVX-512-encoded copy may be merged into code that runs on CPUs without it.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/blocks.h"

// Before the loops over a tile's rows: unrolled, the accumulators of acc[NW][NR] stay in
// registers instead of being loaded and stored on every step.
#define TANDEM_UNROLL _Pragma("GCC unroll 16")

namespace tandem::kernels::cpu::avx512 {

static inline float half_to_float(const half_bytes& h) { return _cvtsh_ss(load_half(h)); }

// GCC 12 warns (-Wuninitialized, a false positive) wherever an unmasked AVX-512 intrinsic
// passes _mm512_undefined_*() as the merge source, as _mm512_cvtph_ps, _mm512_cvtepi32_ps,
// _mm512_inserti64x4, the extracts, the 512-to-256 casts and _mm512_reduce_add_ps do. The
// masked forms with an all-ones mask compile to the same instructions and name a defined
// source; the kernels use these wrappers instead.
static inline __m512 cvt_f16(__m256i h) { return _mm512_mask_cvtph_ps(_mm512_setzero_ps(), 0xFFFF, h); }
static inline __m512 cvt_i32(__m512i v) { return _mm512_mask_cvtepi32_ps(_mm512_setzero_ps(), 0xFFFF, v); }
static inline __m256i low_half(__m512i v) {
  return _mm512_mask_extracti64x4_epi64(_mm256_setzero_si256(), 0xFF, v, 0);
}
static inline __m256i high_half(__m512i v) {
  return _mm512_mask_extracti64x4_epi64(_mm256_setzero_si256(), 0xFF, v, 1);
}

static inline float hsum(__m512 v) {
  const __m256 hi = _mm512_mask_extractf32x8_ps(_mm256_setzero_ps(), 0xFF, v, 1);
  const __m256 s8 = _mm256_add_ps(_mm512_mask_extractf32x8_ps(_mm256_setzero_ps(), 0xFF, v, 0), hi);
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The lane sum of the AVX2 kernels (simd_avx2.h), operation for operation: the legacy
// block tiles must round exactly as the AVX2 ones do.
static inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

static inline __m512i load64(const void* p) { return _mm512_loadu_si512(p); }
static inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// Two unaligned 32-byte loads into one register: a in the low half, b in the high half.
static inline __m512i load32x2(const void* a, const void* b) {
  return _mm512_mask_inserti64x4(_mm512_setzero_si512(), 0xFF, _mm512_castsi256_si512(load32(a)), load32(b), 1);
}

// One register of two halves: a in the low 256 bits, b in the high 256 bits.
static inline __m512i join(__m256i a, __m256i b) {
  return _mm512_mask_inserti64x4(_mm512_setzero_si512(), 0xFF, _mm512_castsi256_si512(a), b, 1);
}

// Bytes [0, n) at p with zeros above (n clamped to 0..64); the masked-off bytes are never
// touched, so the load may end at the last byte of a mapping or read nothing at all.
static inline __m512i load_bytes(const void* p, int n) {
  const __mmask64 k = n >= 64 ? ~0ULL : n <= 0 ? 0ULL : (1ULL << n) - 1;
  return _mm512_maskz_loadu_epi8(k, p);
}

// Sixteen floats from sixteen fp16 values: the low / high 256 bits of v.
static inline __m512 halves_lo(__m512i v) { return cvt_f16(low_half(v)); }
static inline __m512 halves_hi(__m512i v) { return cvt_f16(high_half(v)); }

// A word-permute index: word i of the result is word w[i] of the source (vpermw), or of
// table a (w[i] < 32) / table b (w[i] - 32) for vpermt2w.
struct word_index {
  alignas(64) uint16_t w[32];
  __m512i load() const { return _mm512_load_si512(w); }
};

// Prefetch of the line holding byte `offset` of p into L1. The address may lie past the end
// of any buffer (a prefetch never faults), so it is formed as an integer, not as a pointer.
// Always inlined, as packed_tile_avx2.h's: GCC drops calls to an out-of-line one.
__attribute__((always_inline)) static inline void prefetch(const void* p, size_t offset) {
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) + offset), _MM_HINT_T0);
}
// The same into L2 (and the levels below it), not L1.
__attribute__((always_inline)) static inline void prefetch_l2(const void* p, size_t offset) {
  _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) + offset), _MM_HINT_T1);
}

// Lanes of the first k elements (k < 16 / 32; the tails of float rows).
static inline __mmask16 first16(int64_t k) { return static_cast<__mmask16>((1u << k) - 1); }
static inline __mmask32 first32(int64_t k) { return static_cast<__mmask32>((1ULL << k) - 1); }

// out[r * out_stride + o] = sum of the lanes of acc[o][r]. Each sum is the same reduction
// tree whatever the tile shape, so a result does not depend on its position in a tile.
template <int NW, int NR>
static inline void store_tile(const __m512 (&acc)[NW][NR], float* out, int64_t out_stride) {
  for (int r = 0; r < NR; ++r)
    for (int o = 0; o < NW; ++o) out[r * out_stride + o] = hsum(acc[o][r]);
}

// Calls f.template operator()<NW, NR>() with NW = n_w (1..4) and NR = n_act (1..4) as
// compile-time constants, so a tile's accumulators live in registers.
template <class F>
static inline void with_tile(int n_w, int n_act, F&& f) {
  auto rows = [&]<int NW>() {
    switch (n_act) {
      case 1: f.template operator()<NW, 1>(); break;
      case 2: f.template operator()<NW, 2>(); break;
      case 3: f.template operator()<NW, 3>(); break;
      default: f.template operator()<NW, 4>(); break;
    }
  };
  switch (n_w) {
    case 1: rows.template operator()<1>(); break;
    case 2: rows.template operator()<2>(); break;
    case 3: rows.template operator()<3>(); break;
    default: rows.template operator()<4>(); break;
  }
}

}  // namespace tandem::kernels::cpu::avx512
