// Pieces the AVX-512 panel kernels share (panel_avx512.cpp: panels packed per call;
// packed_avx512.cpp: weights packed at load). Include only from *_avx512.cpp files; all
// static inline, as simd_avx512.h.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/panel.h"
#include "kernels/cpu/simd_avx512.h"

namespace tandem::kernels::cpu::avx512 {

// f.template operator()<N>() for the N in [Lo, Hi] that equals n (nothing when none does).
template <int Lo, int Hi, class F>
static inline void with_count(int n, F&& f) {
  if constexpr (Lo <= Hi) {
    if (n == Lo) return f.template operator()<Lo>();
    return with_count<Lo + 1, Hi>(n, f);
  }
}

// f.template operator()<R>() for R = n, the activation rows of one kernel call; callers split
// larger counts into calls of at most k_panel_max_act_rows (8) rows.
template <class F>
static inline void with_act_rows(int n, F&& f) {
  with_count<1, 8>(n, f);
}

// The 4 activation bytes at p as one int32 (a vpdpbusd broadcast operand).
static inline int32_t act4(const int8_t* p) { return panel_act4(p); }

// acc + vpdpbusd(w, the 4 bytes at a in every lane), with the broadcast embedded in the
// instruction ({1to16}): one fused uop where GCC emits a vpbroadcastd load and the vpdpbusd
// (it does not fold _mm512_set1_epi32 of a load into vpdpbusd): an 8-row pass over a packed
// matrix measured 2-9% faster by type.
static inline __m512i dpbusd_bcast(__m512i acc, __m512i w, const int8_t* a) {
  asm("vpdpbusd %[a]%{1to16%}, %[w], %[acc]" : [acc] "+v"(acc) : [w] "v"(w), [a] "m"(*reinterpret_cast<const int32_t*>(a)));
  return acc;
}

// Q6_K's high bit pairs: bits 2q, 2q+1 of each byte of h moved to bits 4, 5 (q = 0..3; the
// shifts take literals, so one branch per q).
static inline __m512i q6_high_pair(__m512i h, int q) {
  const __m512i m30 = _mm512_set1_epi8(0x30);
  switch (q) {
    case 0:
      return _mm512_and_si512(_mm512_slli_epi16(h, 4), m30);
    case 1:
      return _mm512_and_si512(_mm512_slli_epi16(h, 2), m30);
    case 2:
      return _mm512_and_si512(h, m30);
    default:
      return _mm512_and_si512(_mm512_srli_epi16(h, 2), m30);
  }
}

// Q4_1 / Q5_1 in ggml's x86 float order, bit for bit equal to the row tiles
// (vec_dot_avx512.cpp): there output (o, r) keeps 8 float lanes, lane j summing
// fma(d * dy, float(dot of the block's columns 4j..4j+3), lane) block by block, plus a fused
// sum of m * s, and ends with the AVX2 lane-sum tree. The vpdpbusd of column group j yields
// exactly lane j's integer for all 16 rows, so one float accumulator per group and activation
// row (8, plus the m * s sum: R <= 2 fits the registers) reproduces every rounding.
// group(b, j): the 64 code bytes of group j of block b; scales(b, d, m): its 16 d and m.
template <int R, class Group, class Scales>
static inline void ggml_order_tile(int64_t nb, const int8_t* codes, int64_t cols, const float* aux, float* out, int64_t out_stride, __mmask16 lanes,
                                   Group&& group, Scales&& scales) {
  __m512 f[R][8], msum[R];
  TANDEM_UNROLL for (int r = 0; r < R; ++r) {
    msum[r] = _mm512_setzero_ps();
    TANDEM_UNROLL for (int g = 0; g < 8; ++g) f[r][g] = _mm512_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    __m512 d, m;
    scales(b, d, m);
    __m512 dd[R];
    TANDEM_UNROLL for (int r = 0; r < R; ++r) {
      const float* x = aux + (r * nb + b) * k_panel_aux_per_sub;
      dd[r] = _mm512_mul_ps(d, _mm512_set1_ps(x[0]));
      msum[r] = _mm512_fmadd_ps(m, _mm512_set1_ps(x[1]), msum[r]);
    }
    TANDEM_UNROLL for (int g = 0; g < 8; ++g) {
      const __m512i c = group(b, g);
      TANDEM_UNROLL for (int r = 0; r < R; ++r) {
        const __m512i dot = _mm512_dpbusd_epi32(_mm512_setzero_si512(), c, _mm512_set1_epi32(act4(codes + r * cols + b * 32 + 4 * g)));
        f[r][g] = _mm512_fmadd_ps(dd[r], _mm512_maskz_cvtepi32_ps(0xFFFF, dot), f[r][g]);
      }
    }
  }
  TANDEM_UNROLL for (int r = 0; r < R; ++r) {
    const __m512 t0 = _mm512_add_ps(f[r][0], f[r][4]), t1 = _mm512_add_ps(f[r][1], f[r][5]);
    const __m512 t2 = _mm512_add_ps(f[r][2], f[r][6]), t3 = _mm512_add_ps(f[r][3], f[r][7]);
    const __m512 sum = _mm512_add_ps(_mm512_add_ps(t0, t2), _mm512_add_ps(t1, t3));
    _mm512_mask_storeu_ps(out + r * out_stride, lanes, _mm512_add_ps(sum, msum[r]));
  }
}

// ggml_order_tile over n_act rows, two at a time.
template <class Group, class Scales>
static inline void ggml_order_rows(int64_t nb, const int8_t* codes, int64_t cols, const float* aux, int n_act, float* out, int64_t out_stride,
                                   __mmask16 lanes, Group&& group, Scales&& scales) {
  const int64_t per_row = nb * k_panel_aux_per_sub;
  for (int r = 0; r < n_act; r += 2) {
    if (n_act - r >= 2)
      ggml_order_tile<2>(nb, codes + r * cols, cols, aux + r * per_row, out + r * out_stride, out_stride, lanes, group, scales);
    else
      ggml_order_tile<1>(nb, codes + r * cols, cols, aux + r * per_row, out + r * out_stride, out_stride, lanes, group, scales);
  }
}

}  // namespace tandem::kernels::cpu::avx512
