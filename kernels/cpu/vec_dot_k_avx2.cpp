// AVX2 dots for the K-quants against Q8_K activations. Codes are unsigned (0..15, 0..31,
// 0..63), so maddubs takes them directly; the sub-block scale rides in the following madd,
// and integer sums stay in eight int32 lanes for the whole 256-element super-block. Offsets
// (Q4_K/Q5_K mins, Q6_K's -32) are applied through the activation's per-16 sums (bsums).
//
// Bounds: maddubs pairs are at most 2*63*127 = 16002 (< int16 max); per super-block a lane
// holds at most 8 * 4 * 63 * 127 * 127 < 2^31 (Q6_K, the widest case).
#include <immintrin.h>

#include "kernels/cpu/simd_avx2.h"
#include "kernels/cpu/vec_dot.h"

namespace tandem::kernels::cpu {
namespace {

using namespace avx2;

template <bool five_bit, class Block>
void dot_k_affine(int64_t n, const Block* x, const uint8_t* ab, size_t act_stride, int n_act, float* out,
                  int64_t out_stride) {
  const int64_t nb = n / k_qk_k;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  with_rows(n_act, [&]<int NR>() {
    const block_q8_k* y[NR];
    __m256 acc[NR];
    float min_sum[NR];
    for (int r = 0; r < NR; ++r) {
      y[r] = reinterpret_cast<const block_q8_k*>(ab + r * act_stride);
      acc[r] = _mm256_setzero_ps();
      min_sum[r] = 0.0f;
    }
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t sc[8], m[8];
      unpack_k_scales(x[b].scales, sc, m);
      __m256i isum[NR];
      for (int r = 0; r < NR; ++r) isum[r] = _mm256_setzero_si256();
      __m256i hbits = _mm256_setzero_si256();
      if constexpr (five_bit) hbits = load32(x[b].qh);
      for (int c = 0; c < 4; ++c) {
        const __m256i raw = load32(x[b].qs + 32 * c);
        __m256i lo = _mm256_and_si256(raw, low4);
        __m256i hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
        if constexpr (five_bit) {
          // Bit 2c / 2c+1 of each qh byte, moved to 0x10. The 16-bit shifts pull bits in from
          // the neighbouring byte only above bit 0, which the mask drops.
          const __m256i one = _mm256_set1_epi8(1);
          lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * c), one), 4));
          hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hbits, 2 * c + 1), one), 4));
        }
        const __m256i sc_lo = _mm256_set1_epi16(sc[2 * c]);
        const __m256i sc_hi = _mm256_set1_epi16(sc[2 * c + 1]);
        for (int r = 0; r < NR; ++r) {
          const int8_t* q8 = y[r][b].qs + 64 * c;
          isum[r] = _mm256_add_epi32(isum[r], dot_u8_i8_scaled(lo, load32(q8), sc_lo));
          isum[r] = _mm256_add_epi32(isum[r], dot_u8_i8_scaled(hi, load32(q8 + 32), sc_hi));
        }
      }
      const float dx = half_to_float(x[b].d);
      const float dminx = half_to_float(x[b].dmin);
      for (int r = 0; r < NR; ++r) {
        const int16_t* bs = y[r][b].bsums;
        int imin = 0;
        for (int j = 0; j < 8; ++j) imin += m[j] * (bs[2 * j] + bs[2 * j + 1]);
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dx * y[r][b].d), _mm256_cvtepi32_ps(isum[r]), acc[r]);
        min_sum[r] += dminx * y[r][b].d * static_cast<float>(imin);
      }
    }
    for (int r = 0; r < NR; ++r) out[r * out_stride] = hsum(acc[r]) - min_sum[r];
  });
}

void dot_q6_k(int64_t n, const block_q6_k* x, const uint8_t* ab, size_t act_stride, int n_act, float* out,
              int64_t out_stride) {
  const int64_t nb = n / k_qk_k;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i low2 = _mm256_set1_epi8(0x03);
  with_rows(n_act, [&]<int NR>() {
    const block_q8_k* y[NR];
    __m256 acc[NR];
    float offset[NR];  // the -32 of every code, summed as 32 * sum(scale * bsum)
    for (int r = 0; r < NR; ++r) {
      y[r] = reinterpret_cast<const block_q8_k*>(ab + r * act_stride);
      acc[r] = _mm256_setzero_ps();
      offset[r] = 0.0f;
    }
    for (int64_t b = 0; b < nb; ++b) {
      const int8_t* sc = x[b].scales;
      __m256i isum[NR];
      for (int r = 0; r < NR; ++r) isum[r] = _mm256_setzero_si256();
      for (int h = 0; h < 2; ++h) {
        const __m256i q0 = load32(x[b].ql + 64 * h);
        const __m256i q1 = load32(x[b].ql + 64 * h + 32);
        const __m256i hb = load32(x[b].qh + 32 * h);
        // Elements l, l+32, l+64, l+96 of this half (l = 0..31), codes 0..63.
        __m256i v[4];
        v[0] = _mm256_or_si256(_mm256_and_si256(q0, low4), _mm256_slli_epi16(_mm256_and_si256(hb, low2), 4));
        v[1] = _mm256_or_si256(_mm256_and_si256(q1, low4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), low2), 4));
        v[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q0, 4), low4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), low2), 4));
        v[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q1, 4), low4),
                               _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), low2), 4));
        for (int k = 0; k < 4; ++k) {
          // Bytes 0..15 belong to sub-block 2k of the half, bytes 16..31 to 2k+1.
          const int s = 8 * h + 2 * k;
          const __m256i scale = _mm256_set_m128i(_mm_set1_epi16(sc[s + 1]), _mm_set1_epi16(sc[s]));
          for (int r = 0; r < NR; ++r)
            isum[r] = _mm256_add_epi32(isum[r], dot_u8_i8_scaled(v[k], load32(y[r][b].qs + 128 * h + 32 * k), scale));
        }
      }
      const float dx = half_to_float(x[b].d);
      for (int r = 0; r < NR; ++r) {
        int ioff = 0;
        for (int s = 0; s < 16; ++s) ioff += sc[s] * y[r][b].bsums[s];
        const float d = dx * y[r][b].d;
        acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(isum[r]), acc[r]);
        offset[r] += d * static_cast<float>(32 * ioff);
      }
    }
    for (int r = 0; r < NR; ++r) out[r * out_stride] = hsum(acc[r]) - offset[r];
  });
}

}  // namespace

void vec_dot_q4_k_avx2(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out,
                       int64_t out_stride) {
  dot_k_affine<false>(n, static_cast<const block_q4_k*>(w), static_cast<const uint8_t*>(act), act_stride, n_act, out,
                      out_stride);
}

void vec_dot_q5_k_avx2(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out,
                       int64_t out_stride) {
  dot_k_affine<true>(n, static_cast<const block_q5_k*>(w), static_cast<const uint8_t*>(act), act_stride, n_act, out,
                     out_stride);
}

void vec_dot_q6_k_avx2(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out,
                       int64_t out_stride) {
  dot_q6_k(n, static_cast<const block_q6_k*>(w), static_cast<const uint8_t*>(act), act_stride, n_act, out,
           out_stride);
}

}  // namespace tandem::kernels::cpu
