// AVX2 (+FMA, F16C) attention: the kernels of attention_simd.h over 8-float registers, exact
// (simd_attention) and the engine's tiled one (prompt_kernel) for CPUs without AVX-512.
#include <immintrin.h>

#include "kernels/cpu/attention_impl.h"
#include "kernels/cpu/simd_avx2.h"

namespace tandem::kernels::cpu {
namespace {

struct avx2_lanes {
  using vec = __m256;
  static constexpr int W = 8;
  static constexpr int fold_slices = 8;  // value-accumulator registers a fold may hold (attention_simd.h)
  static vec load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, vec a) { _mm256_storeu_ps(p, a); }
  static vec zero() { return _mm256_setzero_ps(); }
  static vec set1(float x) { return _mm256_set1_ps(x); }
  static vec add(vec a, vec b) { return _mm256_add_ps(a, b); }
  static vec mul(vec a, vec b) { return _mm256_mul_ps(a, b); }
  static vec round_f16(vec a) { return avx2::round_f16(a); }
  static vec load_f16(const uint16_t* p) { return avx2::load_f16x8(p); }
  static vec unfused(vec a) {
    asm("" : "+x"(a));
    return a;
  }

  // attention_simd.h's online_weights, 8 keys a step, as the AVX-512 lanes' 16: key b is a new
  // maximum when its score exceeds E[b], the running max over the keys before it (NaN scores
  // never count), and takes the key-by-key loop's expf argument (E[b] - sc[b] for a new
  // maximum, sc[b] - E[b] otherwise) through the vector expf with the C library's bits
  // (avx2::expf_exact, simd_avx2.h).
  static void online_weights(const float* sc, int nb, float& m, float* ms, float* w) {
    static_assert(k_attention_key_block % 8 == 0);
    const __m256 ninf = _mm256_set1_ps(-__builtin_inff()), one = _mm256_set1_ps(1.0f);
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int b0 = 0; b0 < k_attention_key_block; b0 += 8) {
      const __m256 valid = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(nb - b0), lane));
      const __m256 s = _mm256_maskload_ps(sc + b0, _mm256_castps_si256(valid));  // 0 past nb
      const __m256 c = _mm256_blendv_ps(ninf, s, _mm256_and_ps(_mm256_cmp_ps(s, s, _CMP_ORD_Q), valid));
      // Inclusive prefix max of c, in three shifted steps (lanes shifted in hold -inf).
      __m256 p = c;
      p = _mm256_max_ps(p, shift_in<1>(p, ninf));
      p = _mm256_max_ps(p, shift_in<2>(p, ninf));
      p = _mm256_max_ps(p, shift_in<4>(p, ninf));
      const __m256 m_in = _mm256_set1_ps(m);
      p = _mm256_max_ps(p, m_in);
      const __m256 e = shift_in<1>(p, m_in);  // E[0] = m, E[b] = p[b - 1]
      const __m256 fresh = _mm256_cmp_ps(c, e, _CMP_GT_OQ);
      const __m256 arg = _mm256_and_ps(valid, _mm256_blendv_ps(_mm256_sub_ps(s, e), _mm256_sub_ps(e, s), fresh));
      const __m256 x = avx2::expf_exact(arg);
      _mm256_storeu_ps(ms + b0, _mm256_blendv_ps(one, x, fresh));
      _mm256_storeu_ps(w + b0, _mm256_and_ps(valid, _mm256_blendv_ps(x, one, fresh)));  // 0 past nb
      m = _mm256_cvtss_f32(_mm256_permutevar8x32_ps(p, _mm256_set1_epi32(7)));          // past nb: -inf, so the max
    }
  }

  // a shifted up by K lanes, the K lowest lanes taken from fill's (all alike here).
  template <int K>
  static __m256 shift_in(__m256 a, __m256 fill) {
    const __m256i up = _mm256_setr_epi32(0, 1 - K < 0 ? 0 : 1 - K, 2 - K < 0 ? 0 : 2 - K, 3 - K < 0 ? 0 : 3 - K, 4 - K, 5 - K, 6 - K, 7 - K);
    return _mm256_blend_ps(_mm256_permutevar8x32_ps(a, up), fill, (1 << K) - 1);
  }
};

}  // namespace
}  // namespace tandem::kernels::cpu

#include "kernels/cpu/attention_simd.h"

namespace tandem::kernels::cpu {

void attend_avx2(const attention_task& t, const attention_scratch& s) { simd_attention<avx2_lanes>::run(t, s); }

}  // namespace tandem::kernels::cpu

// The prompt-row kernel (attention_impl.h, prompt_tile; prompt_kernel) on AVX2, lane masks as
// all-ones lanes. Tiles hold 8 query vectors; keys still go in blocks of 16, and each lane's
// steps are the AVX-512 lane's, so a row gets the same bits on either path.
namespace tandem::kernels::cpu {
namespace {

struct avx2_prompt_lanes {
  using vec = __m256;
  using ivec = __m256i;
  using mask = __m256;
  static constexpr int W = k_prompt_lanes_avx2;
  // Not the decode-row fold from the cache (prompt_kernel::fold_row_block): 16 registers hold
  // too few accumulators.
  static constexpr bool k_fold_from_cache = false;
  static vec load(const float* p) { return _mm256_load_ps(p); }
  static vec loadu(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, vec a) { _mm256_store_ps(p, a); }
  static void storeu(float* p, vec a) { _mm256_storeu_ps(p, a); }
  static vec set1(float x) { return _mm256_set1_ps(x); }
  static vec zero() { return _mm256_setzero_ps(); }
  static vec add(vec a, vec b) { return _mm256_add_ps(a, b); }
  static vec sub(vec a, vec b) { return _mm256_sub_ps(a, b); }
  static vec mul(vec a, vec b) { return _mm256_mul_ps(a, b); }
  static vec min(vec a, vec b) { return _mm256_min_ps(a, b); }
  static vec max(vec a, vec b) { return _mm256_max_ps(a, b); }
  static vec fmadd(vec a, vec b, vec c) { return _mm256_fmadd_ps(a, b, c); }
  static vec fnmadd(vec a, vec b, vec c) { return _mm256_fnmadd_ps(a, b, c); }
  static vec load_f16(const uint16_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static ivec load_pos(const int32_t* p) { return _mm256_load_si256(reinterpret_cast<const __m256i*>(p)); }
  // pos >= k as pos > k - 1 (k >= 0, so no wrap).
  static mask visible(ivec pos, int32_t k) { return _mm256_castsi256_ps(_mm256_cmpgt_epi32(pos, _mm256_set1_epi32(k - 1))); }
  static vec blend(mask m, vec no, vec yes) { return _mm256_blendv_ps(no, yes, m); }
  static mask live(vec x) { return _mm256_cmp_ps(x, _mm256_set1_ps(-INFINITY), _CMP_NEQ_OQ); }
  static vec keep(mask a, mask b, vec x) { return _mm256_and_ps(_mm256_and_ps(a, b), x); }

  static vec round(vec x) { return _mm256_round_ps(x, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  // p * 2^n for integral n in [-126, 127]: 2^n built from its exponent bits is a normal float,
  // so the product rounds once, as AVX-512's scalef does.
  static vec scale2(vec p, vec n) {
    const __m256i two_n = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_mul_ps(p, _mm256_castsi256_ps(two_n));
  }

  // x[0..P) repeated across the lanes. Two floats through loadl_epi64, whose pointer type may
  // alias them (a double load may not).
  template <int P>
  static vec key_lanes(const float* x) {
    if constexpr (P == 1)
      return _mm256_set1_ps(x[0]);
    else if constexpr (P == 2)
      return _mm256_castsi256_ps(_mm256_broadcastq_epi64(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(x))));
    else
      return _mm256_broadcast_ps(reinterpret_cast<const __m128*>(x));
  }

  // P registers holding elements e .. e+7 of KV heads 0..P-1 (r[h]: head h's) to o[P * k + h]
  // for k < 8, by unpacks, shuffles and 128-bit permutes (the plain loop stored a float at a
  // time).
  template <int P>
  requires(P == 2 || P == 4) static void interleave_regs(const __m256* r, float* o) {
    const __m256 ab_lo = _mm256_unpacklo_ps(r[0], r[1]), ab_hi = _mm256_unpackhi_ps(r[0], r[1]);
    if constexpr (P == 2) {
      // ab_lo: a0 b0 a1 b1 | a4 b4 a5 b5; ab_hi: a2 b2 a3 b3 | a6 b6 a7 b7.
      _mm256_storeu_ps(o, _mm256_permute2f128_ps(ab_lo, ab_hi, 0x20));      // elements e .. e+3
      _mm256_storeu_ps(o + 8, _mm256_permute2f128_ps(ab_lo, ab_hi, 0x31));  // e+4 .. e+7
    } else {
      const __m256 cd_lo = _mm256_unpacklo_ps(r[2], r[3]), cd_hi = _mm256_unpackhi_ps(r[2], r[3]);
      // u_k holds element k of the four heads in its low half and element k + 4 in its high.
      const __m256 u0 = _mm256_shuffle_ps(ab_lo, cd_lo, 0x44), u1 = _mm256_shuffle_ps(ab_lo, cd_lo, 0xEE);
      const __m256 u2 = _mm256_shuffle_ps(ab_hi, cd_hi, 0x44), u3 = _mm256_shuffle_ps(ab_hi, cd_hi, 0xEE);
      _mm256_storeu_ps(o, _mm256_permute2f128_ps(u0, u1, 0x20));       // elements e, e+1
      _mm256_storeu_ps(o + 8, _mm256_permute2f128_ps(u2, u3, 0x20));   // e+2, e+3
      _mm256_storeu_ps(o + 16, _mm256_permute2f128_ps(u0, u1, 0x31));  // e+4, e+5
      _mm256_storeu_ps(o + 24, _mm256_permute2f128_ps(u2, u3, 0x31));  // e+6, e+7
    }
  }

  // Only decode rows interleave (kv_period > 1), a key at a time.
  template <int P>
  static void interleave_keys(const float* rows, int dp, float* dst) {
    if constexpr (P == 2 || P == 4) {
      for (int e = 0; e < dp; e += W) {
        __m256 r[P];
        for (int h = 0; h < P; ++h) r[h] = _mm256_loadu_ps(rows + static_cast<size_t>(h) * dp + e);
        interleave_regs<P>(r, dst + static_cast<size_t>(e) * P);
      }
    } else {
      interleave_keys_any<P>(rows, dp, dst);
    }
  }
};

}  // namespace

void attend_prompt_avx2(const prompt_tile& t, float* scratch) { prompt_kernel<avx2_prompt_lanes>::run(t, scratch); }

}  // namespace tandem::kernels::cpu
