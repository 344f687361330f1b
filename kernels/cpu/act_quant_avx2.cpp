// AVX2 forms of the Q8_0 / Q8_1 / Q8_K activation quantizers of act_quant.cpp, equal to them
// byte for byte, for the same reasons as the AVX-512 forms (act_quant_avx512.cpp): maxima do
// not depend on order, x * id is the same float product, and vcvtps2dq rounds to nearest even
// as nearbyint and nearest_int do in the default FP mode. Without them the AVX2 path ran the
// scalar loops, one libm nearbyint call per element: ~3% of a one-thread decode, and on a pool
// time the other threads wait through (matmul converts the row before they can use it).
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/act_quant.h"
#include "kernels/cpu/blocks.h"

namespace tandem::kernels::cpu {
namespace {

static inline __m256 abs_ps(__m256 v) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), v); }
static inline float lane_max(__m256 v) {
  __m128 q = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  q = _mm_max_ps(q, _mm_movehl_ps(q, q));
  q = _mm_max_ss(q, _mm_movehdup_ps(q));
  return _mm_cvtss_f32(q);
}
static inline int lane_sum(__m256i v) {
  __m128i q = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  q = _mm_add_epi32(q, _mm_shuffle_epi32(q, _MM_SHUFFLE(1, 0, 3, 2)));
  q = _mm_add_epi32(q, _mm_shuffle_epi32(q, _MM_SHUFFLE(2, 3, 0, 1)));
  return _mm_cvtsi128_si32(q);
}
// fp32_to_fp16 by F16C: the same round-to-nearest-even for every finite value and infinity.
static inline uint16_t to_half(float f) {
  return static_cast<uint16_t>(_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT), 0));
}
// Four registers of 8 int32 codes (each within int8) -> 32 bytes in element order. The packs
// work within 128-bit lanes, so the result's dwords come out as 0 2 4 6 1 3 5 7 of the order
// wanted; the permute puts them back.
static inline void store_codes32(int8_t* out, __m256i q0, __m256i q1, __m256i q2, __m256i q3) {
  const __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(q0, q1), _mm256_packs_epi32(q2, q3));
  const __m256i ordered = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), ordered);
}

// q = round(x * id) into 32 int8 at out; returns their sum (when Sum: Q8_0 needs none).
template <bool Sum>
static inline int codes32(const float* x, float id, int8_t* out) {
  const __m256 vid = _mm256_set1_ps(id);
  __m256i q[4];
  for (int k = 0; k < 4; ++k) q[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), vid));
  store_codes32(out, q[0], q[1], q[2], q[3]);
  if constexpr (Sum) return lane_sum(_mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3])));
  return 0;
}

template <bool Sum, typename Block>
int block_q8(const float* x, Block& y, float& d_out) {
  const __m256 m01 = _mm256_max_ps(abs_ps(_mm256_loadu_ps(x)), abs_ps(_mm256_loadu_ps(x + 8)));
  const __m256 m23 = _mm256_max_ps(abs_ps(_mm256_loadu_ps(x + 16)), abs_ps(_mm256_loadu_ps(x + 24)));
  const float amax = lane_max(_mm256_max_ps(m01, m23));
  const float d = amax / 127.0f;
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  const int sum = codes32<Sum>(x, id, y.qs);
  store_half(y.d, to_half(d));
  d_out = d;
  return sum;
}

}  // namespace

void quantize_q8_0_act_avx2(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<block_q8_0*>(dst);
  float d;
  for (int64_t i = 0; i < n / k_qk_legacy; ++i, x += k_qk_legacy) block_q8<false>(x, y[i], d);
}

void quantize_q8_1_avx2(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<block_q8_1*>(dst);
  for (int64_t i = 0; i < n / k_qk_legacy; ++i, x += k_qk_legacy) {
    float d;
    const int sum = block_q8<true>(x, y[i], d);
    store_half(y[i].s, to_half(static_cast<float>(sum) * d));
  }
}

void quantize_q8_k_avx2(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<block_q8_k*>(dst);
  for (int64_t i = 0; i < n / k_qk_k; ++i, x += k_qk_k) {
    __m256 m = _mm256_setzero_ps();
    for (int j = 0; j < k_qk_k; j += 8) m = _mm256_max_ps(m, abs_ps(_mm256_loadu_ps(x + j)));
    const float amax = lane_max(m);
    if (amax == 0.0f) {
      y[i].d = 0.0f;
      std::memset(y[i].qs, 0, sizeof y[i].qs);
      std::memset(y[i].bsums, 0, sizeof y[i].bsums);
      continue;
    }
    // The first element of largest magnitude, as the scalar loop's strict > keeps it.
    float max = 0.0f;
    const __m256 vamax = _mm256_set1_ps(amax);
    for (int j = 0; j < k_qk_k; j += 8) {
      const int hit = _mm256_movemask_ps(_mm256_cmp_ps(abs_ps(_mm256_loadu_ps(x + j)), vamax, _CMP_EQ_OQ));
      if (hit) {
        max = x[j + __builtin_ctz(static_cast<unsigned>(hit))];
        break;
      }
    }
    const float iscale = -127.0f / max;
    const __m256 vs = _mm256_set1_ps(iscale);
    const __m256i cap = _mm256_set1_epi32(127);
    for (int g = 0; g < 8; ++g) {  // 32 codes, two bsums a pass
      __m256i q[4];
      for (int k = 0; k < 4; ++k) q[k] = _mm256_min_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(vs, _mm256_loadu_ps(x + 32 * g + 8 * k))), cap);
      store_codes32(y[i].qs + 32 * g, q[0], q[1], q[2], q[3]);
      y[i].bsums[2 * g] = static_cast<int16_t>(lane_sum(_mm256_add_epi32(q[0], q[1])));
      y[i].bsums[2 * g + 1] = static_cast<int16_t>(lane_sum(_mm256_add_epi32(q[2], q[3])));
    }
    y[i].d = 1.0f / iscale;
  }
}

}  // namespace tandem::kernels::cpu
