// AVX-512 forms of the Q8_0 / Q8_1 / Q8_K activation quantizers of act_quant.cpp, equal to
// them byte for byte: maxima do not depend on order, x * id is the same float product, and
// vcvtps2dq rounds to nearest even as nearbyint and nearest_int do in the default FP mode.
// (NaN activations, garbage either way, may give other bytes: vmaxps and std::max treat NaN
// differently.)
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/act_quant_impl.h"
#include "kernels/cpu/blocks.h"
#include "kernels/cpu/quants.h"

namespace tandem::kernels::cpu {
namespace {

constexpr __mmask16 k_all16 = 0xFFFF;

// Masked forms with every lane set: GCC 12 reports false -Wmaybe-uninitialized warnings from
// the unmasked ones, its 512-to-256-bit casts and its reduce helpers (see simd_avx512.h).
static inline __m512 abs_ps(__m512 v) { return _mm512_mask_abs_ps(v, k_all16, v); }
static inline __m512 max_ps(__m512 a, __m512 b) { return _mm512_maskz_max_ps(k_all16, a, b); }
// Lane reductions by halving (max and integer sums do not depend on their order); the
// scalar loops they replace cost more than the rest of a 32-element block.
static inline float lane_max(__m512 v) {
  __m256 h = _mm256_max_ps(_mm512_maskz_extractf32x8_ps(0xFF, v, 0), _mm512_maskz_extractf32x8_ps(0xFF, v, 1));
  __m128 q = _mm_max_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  q = _mm_max_ps(q, _mm_movehl_ps(q, q));
  q = _mm_max_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}
static inline int lane_sum(__m512i v) {
  __m256i h = _mm256_add_epi32(_mm512_maskz_extracti64x4_epi64(0xF, v, 0), _mm512_maskz_extracti64x4_epi64(0xF, v, 1));
  __m128i q = _mm_add_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
  q = _mm_add_epi32(q, _mm_shuffle_epi32(q, _MM_SHUFFLE(1, 0, 3, 2)));
  q = _mm_add_epi32(q, _mm_shuffle_epi32(q, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(q);
}
// fp32_to_fp16 by F16C: the same round-to-nearest-even for every finite value and infinity.
static inline uint16_t to_half(float f) {
  return static_cast<uint16_t>(_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT), 0));
}

// q = round(x * id) into 32 int8 at out; returns their sum (when Sum: Q8_0 needs none).
template <bool Sum>
static inline int codes32(const float* x, float id, int8_t* out) {
  const __m512 vid = _mm512_set1_ps(id);
  const __m512i q0 = _mm512_maskz_cvtps_epi32(k_all16, _mm512_mul_ps(_mm512_loadu_ps(x), vid));
  const __m512i q1 = _mm512_maskz_cvtps_epi32(k_all16, _mm512_mul_ps(_mm512_loadu_ps(x + 16), vid));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_maskz_cvtepi32_epi8(k_all16, q0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16), _mm512_maskz_cvtepi32_epi8(k_all16, q1));
  if constexpr (Sum) return lane_sum(_mm512_add_epi32(q0, q1));
  return 0;
}

template <bool Sum, typename Block>
int block_q8(const float* x, Block& y, float& d_out) {
  const float amax = lane_max(max_ps(abs_ps(_mm512_loadu_ps(x)), abs_ps(_mm512_loadu_ps(x + 16))));
  const float d = amax / 127.0f;
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  const int sum = codes32<Sum>(x, id, y.qs);
  store_half(y.d, to_half(d));
  d_out = d;
  return sum;
}

}  // namespace

void quantize_q8_0_act_avx512(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<block_q8_0*>(dst);
  float d;
  for (int64_t i = 0; i < n / k_qk_legacy; ++i, x += k_qk_legacy) block_q8<false>(x, y[i], d);
}

void quantize_q8_1_avx512(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<block_q8_1*>(dst);
  for (int64_t i = 0; i < n / k_qk_legacy; ++i, x += k_qk_legacy) {
    float d;
    const int sum = block_q8<true>(x, y[i], d);
    store_half(y[i].s, to_half(static_cast<float>(sum) * d));
  }
}

void quantize_q8_k_avx512(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<block_q8_k*>(dst);
  for (int64_t i = 0; i < n / k_qk_k; ++i, x += k_qk_k) {
    __m512 m = _mm512_setzero_ps();
    for (int j = 0; j < k_qk_k; j += 16) m = max_ps(m, abs_ps(_mm512_loadu_ps(x + j)));
    const float amax = lane_max(m);
    if (amax == 0.0f) {
      y[i].d = 0.0f;
      std::memset(y[i].qs, 0, sizeof y[i].qs);
      std::memset(y[i].bsums, 0, sizeof y[i].bsums);
      continue;
    }
    // The first element of largest magnitude, as the scalar loop's strict > keeps it.
    float max = 0.0f;
    for (int j = 0; j < k_qk_k; j += 16) {
      const __mmask16 hit = _mm512_cmp_ps_mask(abs_ps(_mm512_loadu_ps(x + j)), _mm512_set1_ps(amax), _CMP_EQ_OQ);
      if (hit) {
        max = x[j + __builtin_ctz(hit)];
        break;
      }
    }
    const float iscale = -127.0f / max;
    const __m512 vs = _mm512_set1_ps(iscale);
    const __m512i cap = _mm512_set1_epi32(127);
    for (int g = 0; g < 16; ++g) {
      const __m512i q = _mm512_maskz_min_epi32(k_all16, _mm512_maskz_cvtps_epi32(k_all16, _mm512_mul_ps(vs, _mm512_loadu_ps(x + 16 * g))), cap);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y[i].qs + 16 * g), _mm512_maskz_cvtepi32_epi8(k_all16, q));
      y[i].bsums[g] = static_cast<int16_t>(lane_sum(q));
    }
    y[i].d = 1.0f / iscale;
  }
}

}  // namespace tandem::kernels::cpu
