// AVX-512 attention: the kernel of attention_simd.h with 16-float registers for the row work
// (widening, value accumulation) and a vectorised online softmax; the dot products keep the
// shared 8-lane order.
#include <immintrin.h>

#include <cstdint>

#include "kernels/cpu/simd_avx512.h"

namespace tandem::kernels::cpu {
namespace {

struct avx512_lanes {
  using vec = __m512;
  static constexpr int W = 16;
  static constexpr int fold_slices = 16;  // value-accumulator registers a fold may hold (attention_simd.h)
  // Conversions use the zero-masking forms with every lane selected, which are the plain
  // instructions: GCC 12 warns (wrongly) that the unmasked intrinsics' undefined pass-through
  // may be uninitialized.
  static constexpr __mmask16 k_all = 0xFFFF;
  static vec load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, vec a) { _mm512_storeu_ps(p, a); }
  static vec zero() { return _mm512_setzero_ps(); }
  static vec set1(float x) { return _mm512_set1_ps(x); }
  static vec add(vec a, vec b) { return _mm512_add_ps(a, b); }
  static vec mul(vec a, vec b) { return _mm512_mul_ps(a, b); }
  static vec round_f16(vec a) { return _mm512_maskz_cvtph_ps(k_all, _mm512_maskz_cvtps_ph(k_all, a, _MM_FROUND_TO_NEAREST_INT)); }
  static vec load_f16(const uint16_t* p) { return _mm512_maskz_cvtph_ps(k_all, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static vec unfused(vec a) {
    asm("" : "+v"(a));
    return a;
  }

  // attention_simd.h's online_weights for a block of up to 16 keys at once. Key b is a new
  // maximum when its score exceeds the running max over the keys before it (E[b], an
  // exclusive prefix max, NaN scores never counting), and takes the same expf argument as
  // the key-by-key loop: E[b] - sc[b] for a new maximum, sc[b] - E[b] otherwise, each
  // through the vector expf with the C library's bits (avx512::expf_exact, simd_avx512.h).
  static void online_weights(const float* sc, int nb, float& m, float* ms, float* w) {
    const __mmask16 valid = nb >= 16 ? __mmask16{0xFFFF} : static_cast<__mmask16>((1u << nb) - 1);
    const __m512 ninf = _mm512_set1_ps(-__builtin_inff());
    const __m512 s = _mm512_maskz_loadu_ps(valid, sc);
    const __mmask16 ordered = _mm512_cmp_ps_mask(s, s, _CMP_ORD_Q) & valid;
    const __m512 c = _mm512_mask_blend_ps(ordered, ninf, s);
    // Inclusive prefix max of c, in four shifted steps (lanes shifted in hold -inf).
    __m512 p = c;
    p = _mm512_maskz_max_ps(0xFFFF, p, shift_in(p, ninf, 1));
    p = _mm512_maskz_max_ps(0xFFFF, p, shift_in(p, ninf, 2));
    p = _mm512_maskz_max_ps(0xFFFF, p, shift_in(p, ninf, 4));
    p = _mm512_maskz_max_ps(0xFFFF, p, shift_in(p, ninf, 8));
    const __m512 m_in = _mm512_set1_ps(m);
    p = _mm512_maskz_max_ps(0xFFFF, p, m_in);
    const __m512 e = shift_in(p, m_in, 1);  // E[0] = m, E[b] = p[b - 1]
    const __mmask16 fresh = _mm512_cmp_ps_mask(c, e, _CMP_GT_OQ);
    const __m512 arg = _mm512_maskz_mov_ps(valid, _mm512_mask_blend_ps(fresh, _mm512_sub_ps(s, e), _mm512_sub_ps(e, s)));
    const __m512 x = avx512::expf_exact(arg);
    const __m512 one = _mm512_set1_ps(1.0f);
    _mm512_storeu_ps(ms, _mm512_mask_blend_ps(fresh, one, x));
    _mm512_storeu_ps(w, _mm512_maskz_mov_ps(valid, _mm512_mask_blend_ps(fresh, x, one)));  // 0 past nb
    alignas(64) float last[16];
    _mm512_store_ps(last, p);
    m = last[15];  // lanes past nb hold -inf scores, so the max stands there too
  }

  // The f16 contract's key block two keys to a register (attention_simd.h, run_f16): chunk i
  // (elements 8i .. 8i+7) of keys 2p and 2p+1 side by side at dst + (i * 8 + p) * 16, so one
  // 16-lane multiply-add serves two keys' eight partial sums and a chunk of the block is 512
  // contiguous bytes. rows[b] is key b's row (d halves, d a multiple of 8), for b < nb;
  // keys nb .. 15 are zeros.
  static void widen_keys_paired(const uint16_t* const* rows, int nb, int d, float* dst) {
    for (int p = 0; p < 8; ++p) {
      const uint16_t* a = 2 * p < nb ? rows[2 * p] : nullptr;
      const uint16_t* b = 2 * p + 1 < nb ? rows[2 * p + 1] : nullptr;
      for (int i = 0; i < d / 8; ++i) {
        const __m128i lo = a ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(a + 8 * i)) : _mm_setzero_si128();
        const __m128i hi = b ? _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 8 * i)) : _mm_setzero_si128();
        const __m256i both = _mm256_inserti128_si256(_mm256_castsi128_si256(lo), hi, 1);
        _mm512_storeu_ps(dst + (i * 8 + p) * 16, _mm512_maskz_cvtph_ps(k_all, both));
      }
    }
  }

  // scores[0..16) = dot(q, key b) * scale for the 16 keys of a paired block, each in the
  // contract's order: lane l of a key's eight sums takes elements 8i + l in turn, then the
  // pairwise tree ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)). The products of halves
  // are exact, so fused multiply-adds round as separate ones would (attention_simd.h).
  static void dot_pairs(const float* q, const float* kp, int d, float scale, float* scores) {
    __m512 acc[8];
    for (int p = 0; p < 8; ++p) acc[p] = _mm512_setzero_ps();
    for (int i = 0; i < d / 8; ++i) {
      const __m512 x = _mm512_maskz_broadcast_f32x8(k_all, _mm256_loadu_ps(q + 8 * i));
      const float* c = kp + i * 128;
#pragma GCC unroll 8
      for (int p = 0; p < 8; ++p) acc[p] = _mm512_fmadd_ps(x, _mm512_loadu_ps(c + 16 * p), acc[p]);
    }
    // In each 128-bit lane, [a0 + a1, a2 + a3, b0 + b1, b2 + b3], as _mm_hadd_ps.
    auto hadd = [](__m512 a, __m512 b) {
      return _mm512_add_ps(_mm512_shuffle_ps(a, b, _MM_SHUFFLE(2, 0, 2, 0)), _mm512_shuffle_ps(a, b, _MM_SHUFFLE(3, 1, 3, 1)));
    };
    // Four pair registers (keys 2g .. 2g+7) -> their 8 sums: lanes 0-3 keys 2g, 2g+2, 2g+4,
    // 2g+6 (128-bit lane 0's sums 0-3 plus lane 1's sums 4-7), lanes 8-11 the odd keys.
    auto tree = [&](int g) {
      const __m512 v = hadd(hadd(acc[g], acc[g + 1]), hadd(acc[g + 2], acc[g + 3]));
      return _mm512_add_ps(v, _mm512_maskz_shuffle_f32x4(k_all, v, v, _MM_SHUFFLE(2, 3, 0, 1)));
    };
    const __m512i order = _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 16, 24, 17, 25, 18, 26, 19, 27);
    const __m512 all = _mm512_permutex2var_ps(tree(0), order, tree(4));
    _mm512_storeu_ps(scores, _mm512_mul_ps(all, _mm512_set1_ps(scale)));
  }

  // a shifted up by k lanes, the k lowest lanes taken from fill's (all alike here).
  template <int K>
  static __m512 shift_in_k(__m512 a, __m512 fill) {
    return _mm512_castsi512_ps(_mm512_maskz_alignr_epi32(0xFFFF, _mm512_castps_si512(a), _mm512_castps_si512(fill), 16 - K));
  }
  static __m512 shift_in(__m512 a, __m512 fill, int k) {
    switch (k) {
      case 1:
        return shift_in_k<1>(a, fill);
      case 2:
        return shift_in_k<2>(a, fill);
      case 4:
        return shift_in_k<4>(a, fill);
      default:
        return shift_in_k<8>(a, fill);
    }
  }
};

}  // namespace
}  // namespace tandem::kernels::cpu

#include "kernels/cpu/attention_simd.h"

namespace tandem::kernels::cpu {

void attend_avx512(const attention_task& t, const attention_scratch& s) { simd_attention<avx512_lanes>::run(t, s); }

}  // namespace tandem::kernels::cpu
