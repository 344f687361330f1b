// AVX-512 forms of the Q8_0 / Q8_1 / Q8_K activation quantizers of act_quant.cpp, equal to
// them byte for byte: maxima do not depend on order, x * id is the same float product, and
// vcvtps2dq rounds to nearest even as nearbyint and nearest_int do in the default FP mode.
// (NaN activations, garbage either way, may give other bytes: vmaxps and std::max treat NaN
// differently.)
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/act_quant.h"
#include "kernels/cpu/blocks.h"
#include "kernels/cpu/panel.h"
#include "kernels/cpu/quants.h"
#include "kernels/cpu/simd_avx512.h"

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

// Lane b of the result: op over the 16 lanes of v[b], for 16 vectors at once (45 operations,
// where 16 lane_max or lane_sum calls take ~110). Pairs of vectors meet by unpacks within
// 128-bit lanes, then by shuffles of 128-bit lanes; each step combines lanes of one vector
// only, so any order-free op (max, integer add) gives the per-vector reductions.
template <class Op>
static inline __m512i reduce16(const __m512i* v, Op op) {
  const auto ps = [](__m512i x) { return _mm512_castsi512_ps(x); };
  const auto pd = [](__m512i x) { return _mm512_castsi512_pd(x); };
  __m512i t[8], u[4], w[2];
  for (int k = 0; k < 8; ++k)
    t[k] = op(_mm512_castps_si512(_mm512_maskz_unpacklo_ps(k_all16, ps(v[2 * k]), ps(v[2 * k + 1]))),
              _mm512_castps_si512(_mm512_maskz_unpackhi_ps(k_all16, ps(v[2 * k]), ps(v[2 * k + 1]))));
  for (int k = 0; k < 4; ++k)
    u[k] = op(_mm512_castpd_si512(_mm512_maskz_unpacklo_pd(0xFF, pd(t[2 * k]), pd(t[2 * k + 1]))),
              _mm512_castpd_si512(_mm512_maskz_unpackhi_pd(0xFF, pd(t[2 * k]), pd(t[2 * k + 1]))));
  for (int k = 0; k < 2; ++k)
    w[k] = op(_mm512_maskz_shuffle_i32x4(k_all16, u[2 * k], u[2 * k + 1], _MM_SHUFFLE(2, 0, 2, 0)),
              _mm512_maskz_shuffle_i32x4(k_all16, u[2 * k], u[2 * k + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  return op(_mm512_maskz_shuffle_i32x4(k_all16, w[0], w[1], _MM_SHUFFLE(2, 0, 2, 0)),
            _mm512_maskz_shuffle_i32x4(k_all16, w[0], w[1], _MM_SHUFFLE(3, 1, 3, 1)));
}
static inline __m512i max_bits(__m512i a, __m512i b) { return _mm512_castps_si512(max_ps(_mm512_castsi512_ps(a), _mm512_castsi512_ps(b))); }
static inline __m512i add_i32(__m512i a, __m512i b) { return _mm512_add_epi32(a, b); }

// q = round(x * id) into 32 int8 at out; returns the 16 lanes' partial sums of the codes.
static inline __m512i codes32_lanes(const float* x, float id, int8_t* out) {
  const __m512 vid = _mm512_set1_ps(id);
  const __m512i q0 = _mm512_maskz_cvtps_epi32(k_all16, _mm512_mul_ps(_mm512_loadu_ps(x), vid));
  const __m512i q1 = _mm512_maskz_cvtps_epi32(k_all16, _mm512_mul_ps(_mm512_loadu_ps(x + 16), vid));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out), _mm512_maskz_cvtepi32_epi8(k_all16, q0));
  _mm_storeu_si128(reinterpret_cast<__m128i*>(out + 16), _mm512_maskz_cvtepi32_epi8(k_all16, q1));
  return _mm512_add_epi32(q0, q1);
}
// The same, returning the codes' sum (when Sum: Q8_0 needs none).
template <bool Sum>
static inline int codes32(const float* x, float id, int8_t* out) {
  const __m512i lanes = codes32_lanes(x, id, out);
  if constexpr (Sum) return lane_sum(lanes);
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

// The aux floats of one panel sub-block (panel.h): {da, ds, offset * sum as int32 bits}.
static inline void put_aux(float* a, float da, float ds, int32_t term) {
  a[0] = da;
  a[1] = ds;
  std::memcpy(a + 2, &term, sizeof term);
}

// quantize_q8_k_avx512's block: codes into qs (columns [32c, 32c + 32) at qs + c * stride),
// sums of each 16 into bsums; returns d.
static inline float block_q8_k_codes(const float* x, int8_t* qs, int16_t* bsums, int64_t stride = 32) {
  __m512 m = _mm512_setzero_ps();
  for (int j = 0; j < k_qk_k; j += 16) m = max_ps(m, abs_ps(_mm512_loadu_ps(x + j)));
  const float amax = lane_max(m);
  if (amax == 0.0f) {
    for (int c = 0; c < k_qk_k / 32; ++c) std::memset(qs + c * stride, 0, 32);
    std::memset(bsums, 0, 16 * sizeof(int16_t));
    return 0.0f;
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
  __m512i q[16];
  for (int g = 0; g < 16; ++g) {
    q[g] = _mm512_maskz_min_epi32(k_all16, _mm512_maskz_cvtps_epi32(k_all16, _mm512_mul_ps(vs, _mm512_loadu_ps(x + 16 * g))), cap);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(qs + (g / 2) * stride + 16 * (g % 2)), _mm512_maskz_cvtepi32_epi8(k_all16, q[g]));
  }
  // Each sum of 16 fits an int16 (|code| <= 127): the 16 sums narrowed in one store.
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(bsums), _mm512_maskz_cvtepi32_epi16(k_all16, reduce16(q, add_i32)));
  return 1.0f / iscale;
}

// Blocks of Q8_0 or Q8_1 (q8_1) into the panel form: nb (1..16) blocks of 32 from x, block b's
// codes at codes + b * cs and its aux floats at aux + b * as; N: 16 when nb is (the full
// groups' copy, with no lane tests), else 0. Their maxima, scales, sums and aux floats go as
// vectors, lane b for block b, each by the scalar steps' own operations (IEEE division and
// products, F16C rounding), so every byte is block_q8's; empty lanes (b >= nb) read nothing
// and write nothing. A tail of 8 blocks (2,816 or 768 columns) took as long one block at a
// time as 48 blocks did in groups.
template <int N>
static inline void legacy_group(bool q8_1, int offset, const float* x, int8_t* codes, int64_t cs, float* aux, int64_t as, int nb) {
  auto live = [&](int b) { return N == 16 || b < nb; };
  __m512i v[16];
  for (int b = 0; b < 16; ++b)
    v[b] =
        live(b) ? _mm512_castps_si512(max_ps(abs_ps(_mm512_loadu_ps(x + 32 * b)), abs_ps(_mm512_loadu_ps(x + 32 * b + 16)))) : _mm512_setzero_si512();
  const __m512 amax = _mm512_castsi512_ps(reduce16(v, max_bits));
  const __m512 d = _mm512_div_ps(amax, _mm512_set1_ps(127.0f));
  const __m512 id = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(amax, _mm512_setzero_ps(), _CMP_NEQ_OQ), _mm512_set1_ps(127.0f), amax);
  alignas(64) float ids[16];
  _mm512_store_ps(ids, id);
  for (int b = 0; b < 16; ++b) v[b] = live(b) ? codes32_lanes(x + 32 * b, ids[b], codes + cs * b) : _mm512_setzero_si512();
  const __m512i sum = reduce16(v, add_i32);
  const __m512 sumf = _mm512_maskz_cvtepi32_ps(k_all16, sum);
  const __m512 da = avx512::cvt_f16(_mm512_maskz_cvtps_ph(k_all16, d, _MM_FROUND_TO_NEAREST_INT));
  const __m512 ds =
      q8_1 ? avx512::cvt_f16(_mm512_maskz_cvtps_ph(k_all16, _mm512_mul_ps(sumf, d), _MM_FROUND_TO_NEAREST_INT)) : _mm512_mul_ps(da, sumf);
  alignas(64) float das[16], dss[16];
  alignas(64) int32_t terms[16];
  _mm512_store_ps(das, da);
  _mm512_store_ps(dss, ds);
  _mm512_store_si512(terms, _mm512_mullo_epi32(sum, _mm512_set1_epi32(offset)));
  for (int b = 0; b < 16; ++b)
    if (live(b)) put_aux(aux + as * b, das[b], dss[b], terms[b]);
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
  for (int64_t i = 0; i < n / k_qk_k; ++i, x += k_qk_k) y[i].d = block_q8_k_codes(x, y[i].qs, y[i].bsums);
}

void panel_act_row_avx512(weight_type act, int sub, int offset, const float* x, int64_t cols, int8_t* codes, float* aux, int64_t code_stride,
                          int64_t aux_stride) {
  const int64_t cs = code_stride, as = aux_stride;
  if (act == weight_type::q8_0 || act == weight_type::q8_1) {
    const bool q8_1 = act == weight_type::q8_1;
    const int64_t blocks = cols / k_qk_legacy;
    // 16 blocks at a time, and the last 1-15 as a group of 16 with empty lanes.
    int64_t i = 0;
    for (; i + 16 <= blocks; i += 16, x += 16 * k_qk_legacy) legacy_group<16>(q8_1, offset, x, codes + cs * i, cs, aux + as * i, as, 16);
    if (i < blocks) legacy_group<0>(q8_1, offset, x, codes + cs * i, cs, aux + as * i, as, static_cast<int>(blocks - i));
    return;
  }
  // Q8_K: blocks of 256, sums per sub-block from the sums of 16.
  const int per = k_qk_k / sub;
  for (int64_t i = 0; i < cols / k_qk_k; ++i, x += k_qk_k) {
    int16_t bsums[16];
    const float d = block_q8_k_codes(x, codes + (k_qk_k / 32) * i * cs, bsums, cs);
    for (int j = 0; j < per; ++j) {
      const int sum = sub == 16 ? bsums[j] : bsums[2 * j] + bsums[2 * j + 1];
      put_aux(aux + as * (i * per + j), d, d * static_cast<float>(sum), offset * sum);
    }
  }
}

}  // namespace tandem::kernels::cpu
