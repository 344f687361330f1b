// AVX2 (+FMA, F16C) attention: the kernel of attention_simd.h over 8-float registers.
#include <immintrin.h>

#include "kernels/cpu/attention_impl.h"
#include "kernels/cpu/expf_exact_avx2.h"
#include "kernels/cpu/simd_math_avx2.h"

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
  // (expf_exact_avx2.h).
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
      m = _mm256_cvtss_f32(_mm256_permutevar8x32_ps(p, _mm256_set1_epi32(7)));  // past nb: -inf, so the max
    }
  }

  // a shifted up by K lanes, the K lowest lanes taken from fill's (all alike here).
  template <int K>
  static __m256 shift_in(__m256 a, __m256 fill) {
    const __m256i up = _mm256_setr_epi32(0, 1 - K < 0 ? 0 : 1 - K, 2 - K < 0 ? 0 : 2 - K, 3 - K < 0 ? 0 : 3 - K, 4 - K,
                                         5 - K, 6 - K, 7 - K);
    return _mm256_blend_ps(_mm256_permutevar8x32_ps(a, up), fill, (1 << K) - 1);
  }
};

}  // namespace
}  // namespace tandem::kernels::cpu

#include "kernels/cpu/attention_simd.h"

namespace tandem::kernels::cpu {

void attend_avx2(const attention_task& t, const attention_scratch& s) { simd_attention<avx2_lanes>::run(t, s); }

}  // namespace tandem::kernels::cpu
