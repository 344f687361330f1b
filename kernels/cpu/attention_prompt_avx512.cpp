// The prompt-row attention kernel (attention_impl.h, prompt_tile) with AVX-512: the kernel of
// attention_simd.h (prompt_kernel) over 16-float registers, lane masks in k registers.
// GCC 12 warns, wrongly, that the undefined pass-through operand of the unmasked AVX-512
// intrinsics (cvtph_ps, max_ps, min_ps) may be used uninitialised.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include "kernels/cpu/attention_simd.h"

namespace tandem::kernels::cpu {
namespace {

struct avx512_prompt_lanes {
  using vec = __m512;
  using ivec = __m512i;
  using mask = __mmask16;
  static constexpr int W = 16;
  // The decode-row fold from the cache (prompt_kernel::fold_row_block): its registers fit AVX-512's 32.
  static constexpr bool k_fold_from_cache = true;
  static vec load(const float* p) { return _mm512_load_ps(p); }
  static vec loadu(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, vec a) { _mm512_store_ps(p, a); }
  static void storeu(float* p, vec a) { _mm512_storeu_ps(p, a); }
  static vec set1(float x) { return _mm512_set1_ps(x); }
  static vec zero() { return _mm512_setzero_ps(); }
  static vec add(vec a, vec b) { return _mm512_add_ps(a, b); }
  static vec sub(vec a, vec b) { return _mm512_sub_ps(a, b); }
  static vec mul(vec a, vec b) { return _mm512_mul_ps(a, b); }
  static vec min(vec a, vec b) { return _mm512_min_ps(a, b); }
  static vec max(vec a, vec b) { return _mm512_max_ps(a, b); }
  static vec fmadd(vec a, vec b, vec c) { return _mm512_fmadd_ps(a, b, c); }
  static vec fnmadd(vec a, vec b, vec c) { return _mm512_fnmadd_ps(a, b, c); }
  static vec load_f16(const uint16_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static ivec load_pos(const int32_t* p) { return _mm512_load_si512(p); }
  static mask visible(ivec pos, int32_t k) { return _mm512_cmpge_epi32_mask(pos, _mm512_set1_epi32(k)); }
  static vec blend(mask m, vec no, vec yes) { return _mm512_mask_blend_ps(m, no, yes); }
  static mask live(vec x) { return _mm512_cmp_ps_mask(x, _mm512_set1_ps(-INFINITY), _CMP_NEQ_OQ); }
  static vec keep(mask a, mask b, vec x) { return _mm512_maskz_mov_ps(a & b, x); }

  static vec round(vec x) { return _mm512_roundscale_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static vec scale2(vec p, vec n) { return _mm512_scalef_ps(p, n); }  // p * 2^n, rounded once

  // Element e of P KV heads' keys (interleaved: x[h] is KV head h's), repeated across the lanes
  // so that lane i holds KV head i % P's.
  template <int P>
  static __m512 key_lanes(const float* x) {
    if constexpr (P == 1) return _mm512_set1_ps(x[0]);
    // Two floats through loadl_epi64, whose pointer type may alias them (a double load may not).
    else if constexpr (P == 2)
      return _mm512_broadcast_f32x2(_mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(x))));
    else
      return _mm512_broadcast_f32x4(_mm_loadu_ps(x));
  }

  // P = 4 registers holding elements e .. e+15 of KV heads 0..3 (r[h]: head h's) to o[4 * k + h]
  // for k < 16: a 4 x 16 transpose in 8 two-source permutes (the unpack and shuffle ladder took
  // 16, and was the tile's largest cost in a decode row's tile): pairs of heads a, b
  // interleaved element by element, then the pairs' 64-bit (a, b) and (c, d) units alternated.
  template <int P>
  requires(P == 4) static void interleave_regs(const __m512* r, float* o) {
    const __m512i first = _mm512_setr_epi64(0, 8, 1, 9, 2, 10, 3, 11), second = _mm512_setr_epi64(4, 12, 5, 13, 6, 14, 7, 15);
    // ab_lo: a0 b0 a1 b1 .. a7 b7; ab_hi: a8 b8 .. a15 b15; cd_* likewise.
    __m512 ab[2], cd[2];
    interleave_pair(r[0], r[1], ab);
    interleave_pair(r[2], r[3], cd);
    const __m512d ab_lo = _mm512_castps_pd(ab[0]), ab_hi = _mm512_castps_pd(ab[1]);
    const __m512d cd_lo = _mm512_castps_pd(cd[0]), cd_hi = _mm512_castps_pd(cd[1]);
    // Moves of whole 64-bit units: the floats' bits pass unchanged.
    _mm512_store_ps(o, _mm512_castpd_ps(_mm512_permutex2var_pd(ab_lo, first, cd_lo)));        // elements e .. e+3
    _mm512_store_ps(o + 16, _mm512_castpd_ps(_mm512_permutex2var_pd(ab_lo, second, cd_lo)));  // e+4 .. e+7
    _mm512_store_ps(o + 32, _mm512_castpd_ps(_mm512_permutex2var_pd(ab_hi, first, cd_hi)));   // e+8 .. e+11
    _mm512_store_ps(o + 48, _mm512_castpd_ps(_mm512_permutex2var_pd(ab_hi, second, cd_hi)));  // e+12 .. e+15
  }

  // P = 2: elements e .. e+15 of KV heads 0 and 1 to o[2 * k + h], two two-source permutes.
  template <int P>
  requires(P == 2) static void interleave_regs(const __m512* r, float* o) {
    __m512 ab[2];
    interleave_pair(r[0], r[1], ab);
    _mm512_store_ps(o, ab[0]);       // elements e .. e+7
    _mm512_store_ps(o + 16, ab[1]);  // e+8 .. e+15
  }

  // a and b interleaved element by element: out[0] = a0 b0 a1 b1 .. a7 b7, out[1] = a8 b8 .. a15 b15.
  static void interleave_pair(__m512 a, __m512 b, __m512 (&out)[2]) {
    const __m512i lo = _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi = _mm512_setr_epi32(8, 24, 9, 25, 10, 26, 11, 27, 12, 28, 13, 29, 14, 30, 15, 31);
    out[0] = _mm512_permutex2var_ps(a, lo, b);
    out[1] = _mm512_permutex2var_ps(a, hi, b);
  }

  // Key row j of the tile's KV heads into the interleaved block: P rows of dp floats at `rows`
  // (row h: KV head h, zero rows past the tile's) to kb[(j * dp + e) * P + h].
  template <int P>
  static void interleave_keys(const float* rows, int dp, float* dst) {
    if constexpr (P == 4) {
      for (int e = 0; e < dp; e += 16) {
        const __m512 r[4] = {_mm512_load_ps(rows + e), _mm512_load_ps(rows + dp + e), _mm512_load_ps(rows + 2 * dp + e),
                             _mm512_load_ps(rows + 3 * dp + e)};
        interleave_regs<4>(r, dst + static_cast<size_t>(e) * 4);
      }
    } else if constexpr (P == 2) {
      for (int e = 0; e < dp; e += 16) {
        const __m512 r[2] = {_mm512_load_ps(rows + e), _mm512_load_ps(rows + dp + e)};
        interleave_regs<2>(r, dst + static_cast<size_t>(e) * 2);
      }
    } else {
      interleave_keys_any<P>(rows, dp, dst);
    }
  }
};

}  // namespace

void attend_prompt_avx512(const prompt_tile& t, float* scratch) { prompt_kernel<avx512_prompt_lanes>::run(t, scratch); }

}  // namespace tandem::kernels::cpu
