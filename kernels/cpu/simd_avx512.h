// AVX-512 building blocks shared by the *_avx512.cpp kernels, and an expf with the C library's
// bits. Include it only from files compiled with the AVX-512 flags (kernels/CMakeLists.txt
// sets them for *_avx512.cpp). Everything is `static` (internal linkage) for the same reason
// as in simd_avx2.h: no AVX-512-encoded copy may be merged into code that runs on CPUs
// without it.
#pragma once

#include <immintrin.h>

#include <cmath>
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
static inline __m256i low_half(__m512i v) { return _mm512_mask_extracti64x4_epi64(_mm256_setzero_si256(), 0xFF, v, 0); }
static inline __m256i high_half(__m512i v) { return _mm512_mask_extracti64x4_epi64(_mm256_setzero_si256(), 0xFF, v, 1); }

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
static inline __m512i join(__m256i a, __m256i b) { return _mm512_mask_inserti64x4(_mm512_setzero_si512(), 0xFF, _mm512_castsi256_si512(a), b, 1); }

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
      case 1:
        f.template operator()<NW, 1>();
        break;
      case 2:
        f.template operator()<NW, 2>();
        break;
      case 3:
        f.template operator()<NW, 3>();
        break;
      default:
        f.template operator()<NW, 4>();
        break;
    }
  };
  switch (n_w) {
    case 1:
      rows.template operator()<1>();
      break;
    case 2:
      rows.template operator()<2>();
      break;
    case 3:
      rows.template operator()<3>();
      break;
    default:
      rows.template operator()<4>();
      break;
  }
}

// e^x on 16 floats with the same bits as the C library's expf, for the kernels whose contract
// names expf (the llama.cpp-compatible attention and SwiGLU).
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
// (tests/kernels/ops_test.cpp) checks a stride of them.

// e^x for 8 doubles holding floats in [-87, 88]: x = k ln2 / 16 + r with k = 16n + j and
// |r| <= ln2 / 32, so e^x = 2^n * 2^(j / 16) * e^r: 2^(j / 16) from a table of 16 doubles (one
// two-register permute), e^r by its Taylor series to r^5 (truncation under 2^-42 relative,
// 2^-19 of a float ulp: far inside the 2^-8 ulp band below). Against the table-free series to
// r^10 this was, the dependent chain is 5 multiply-adds instead of 10.
static inline __m512d exp_pd_near(__m512d x) {
  const __m512d k =
      _mm512_maskz_roundscale_pd(0xFF, _mm512_mul_pd(x, _mm512_set1_pd(16 * 1.4426950408889634)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
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
  const __m512d lo = _mm512_setr_pd(0x1.0000000000000p+0, 0x1.0b5586cf9890fp+0, 0x1.172b83c7d517bp+0, 0x1.2387a6e756238p+0, 0x1.306fe0a31b715p+0,
                                    0x1.3dea64c123422p+0, 0x1.4bfdad5362a27p+0, 0x1.5ab07dd485429p+0);
  const __m512d hi = _mm512_setr_pd(0x1.6a09e667f3bcdp+0, 0x1.7a11473eb0187p+0, 0x1.8ace5422aa0dbp+0, 0x1.9c49182a3f090p+0, 0x1.ae89f995ad3adp+0,
                                    0x1.c199bdd85529cp+0, 0x1.d5818dcfba487p+0, 0x1.ea4afa2a490dap+0);
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
  const __mmask16 in_range = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.0f), _CMP_GE_OQ) & _mm512_cmp_ps_mask(x, _mm512_set1_ps(88.0f), _CMP_LE_OQ);
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
