// AVX2 paths of the element-wise ops (see ops_simd.h). The float ops take row tails through
// masked loads and stores, so every element gets the same arithmetic as the full vectors.
#include "kernels/cpu/ops_simd.h"

#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/quants.h"
#include "kernels/cpu/simd_avx2.h"

namespace tandem::kernels::cpu {

using namespace avx2;

void f32_to_f16_row_avx2(const float* src, uint16_t* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    store_f16x8(dst + i, _mm256_loadu_ps(src + i));
    store_f16x8(dst + i + 8, _mm256_loadu_ps(src + i + 8));
  }
  for (; i + 8 <= n; i += 8) store_f16x8(dst + i, _mm256_loadu_ps(src + i));
  // At most 7 left: the scalar conversion rounds the same way.
  for (; i < n; ++i) dst[i] = fp32_to_fp16(src[i]);
}

void rms_norm_avx2(const float* x, const float* w, float* out, int64_t n, float eps) {
  if (n <= 0) return;
  // Squares are rounded to float (as in the scalar op) before they are widened and summed.
  __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    const __m256 sq = _mm256_mul_ps(v, v);
    s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
    s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(sq, 1)));
  }
  const __m256i tail = first_lanes(static_cast<int>(n - i));
  if (i < n) {
    const __m256 v = _mm256_maskload_ps(x + i, tail);  // zero beyond the row
    const __m256 sq = _mm256_mul_ps(v, v);
    s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(sq)));
    s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(sq, 1)));
  }
  const __m256d s = _mm256_add_pd(s0, s1);
  const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
  const double sum = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const __m256 scale = _mm256_set1_ps(1.0f / __builtin_sqrtf(mean + eps));

  // x*scale first, then *w: the scalar op's order.
  const int64_t full = i;
  for (int64_t j = 0; j < full; j += 8) {
    __m256 y = _mm256_mul_ps(_mm256_loadu_ps(x + j), scale);
    if (w) y = _mm256_mul_ps(y, _mm256_loadu_ps(w + j));
    _mm256_storeu_ps(out + j, y);
  }
  if (full < n) {
    __m256 y = _mm256_mul_ps(_mm256_maskload_ps(x + full, tail), scale);
    if (w) y = _mm256_mul_ps(y, _mm256_maskload_ps(w + full, tail));
    _mm256_maskstore_ps(out + full, tail, y);
  }
}

void softmax_avx2(float* x, int64_t n) {
  if (n <= 0) return;
  const int64_t full = n & ~int64_t{7};
  const __m256i tail = first_lanes(static_cast<int>(n - full));
  const __m256 neg_inf = _mm256_set1_ps(-__builtin_inff());

  __m256 mx = neg_inf;
  for (int64_t i = 0; i < full; i += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(x + i));
  // Masked-off lanes load as 0; blend -inf in so they cannot raise the max.
  if (full < n) mx = _mm256_max_ps(mx, _mm256_blendv_ps(neg_inf, _mm256_maskload_ps(x + full, tail), _mm256_castsi256_ps(tail)));
  __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
  m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
  m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
  const __m256 max_v = _mm256_set1_ps(_mm_cvtss_f32(m4));

  // Exponentials in float, their sum in double (as the scalar op).
  __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
  auto add = [&](__m256 e) {
    s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  };
  for (int64_t i = 0; i < full; i += 8) {
    const __m256 e = exp_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), max_v));
    _mm256_storeu_ps(x + i, e);
    add(e);
  }
  if (full < n) {
    // Masked-off lanes: e^(0 - max) is not added, the blend zeroes it.
    const __m256 e = _mm256_and_ps(exp_ps(_mm256_sub_ps(_mm256_maskload_ps(x + full, tail), max_v)), _mm256_castsi256_ps(tail));
    _mm256_maskstore_ps(x + full, tail, e);
    add(e);
  }
  const __m256d s = _mm256_add_pd(s0, s1);
  const __m128d h = _mm_add_pd(_mm256_castpd256_pd128(s), _mm256_extractf128_pd(s, 1));
  const double sum = _mm_cvtsd_f64(_mm_add_sd(h, _mm_unpackhi_pd(h, h)));

  const __m256 inv = _mm256_set1_ps(static_cast<float>(1.0 / sum));
  for (int64_t i = 0; i < full; i += 8) _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
  if (full < n) _mm256_maskstore_ps(x + full, tail, _mm256_mul_ps(_mm256_maskload_ps(x + full, tail), inv));
}

void exp_avx2(const float* x, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, exp_ps(_mm256_loadu_ps(x + i)));
  if (i < n) {
    const __m256i tail = first_lanes(static_cast<int>(n - i));
    _mm256_maskstore_ps(out + i, tail, exp_ps(_mm256_maskload_ps(x + i, tail)));
  }
}

void swiglu_avx2(float* gate, const float* up, int64_t n) {
  // g / (1 + e^-g) * u, in the scalar op's order: the same clean -0 for very negative g.
  const __m256 one = _mm256_set1_ps(1.0f), neg = _mm256_set1_ps(-0.0f);
  auto silu_mul = [&](__m256 g, __m256 u) { return _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, exp_ps(_mm256_xor_ps(g, neg)))), u); };
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(gate + i, silu_mul(_mm256_loadu_ps(gate + i), _mm256_loadu_ps(up + i)));
  if (i < n) {
    const __m256i tail = first_lanes(static_cast<int>(n - i));
    _mm256_maskstore_ps(gate + i, tail, silu_mul(_mm256_maskload_ps(gate + i, tail), _mm256_maskload_ps(up + i, tail)));
  }
}

void rope_apply_avx2(float* x, int n_heads, int head_dim, int half, bool neox, const float* cs) {
  // Pairs outer, heads inner: a group of pairs' cos and sin are arranged once for every head.
  int i = 0;
  if (neox) {
    for (; i + 8 <= half; i += 8) {
      // cs holds (cos, sin) pairs; the two shuffles gather 8 cosines and 8 sines, the qword
      // permute puts them back in pair order.
      const __m256 lo = _mm256_loadu_ps(cs + 2 * i), hi = _mm256_loadu_ps(cs + 2 * i + 8);
      const __m256 c = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0x88)), 0xD8));
      const __m256 s = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(lo, hi, 0xDD)), 0xD8));
      for (int h = 0; h < n_heads; ++h) {
        float* a = x + static_cast<int64_t>(h) * head_dim + i;
        float* b = a + half;
        const __m256 x0 = _mm256_loadu_ps(a), x1 = _mm256_loadu_ps(b);
        _mm256_storeu_ps(a, _mm256_sub_ps(unfused(_mm256_mul_ps(x0, c)), unfused(_mm256_mul_ps(x1, s))));
        _mm256_storeu_ps(b, _mm256_add_ps(unfused(_mm256_mul_ps(x0, s)), unfused(_mm256_mul_ps(x1, c))));
      }
    }
  } else {
    for (; i + 4 <= half; i += 4) {
      // Lanes (x0, x1) of a pair against (c, c) and, swapped, (s, s): addsub gives x0c - x1s in
      // the even lane and x1c + x0s in the odd one.
      const __m256 t = _mm256_loadu_ps(cs + 2 * i);
      const __m256 c = _mm256_moveldup_ps(t), s = _mm256_movehdup_ps(t);
      for (int h = 0; h < n_heads; ++h) {
        float* v = x + static_cast<int64_t>(h) * head_dim + 2 * i;
        const __m256 xv = _mm256_loadu_ps(v);
        const __m256 swapped = _mm256_permute_ps(xv, 0xB1);
        _mm256_storeu_ps(v, _mm256_addsub_ps(unfused(_mm256_mul_ps(xv, c)), unfused(_mm256_mul_ps(swapped, s))));
      }
    }
  }
  // The last pairs (fewer than a vector's), as the scalar loop (this file may fuse otherwise).
  const int stride = neox ? 1 : 2, other = neox ? half : 1;
  for (int h = 0; h < n_heads; ++h)
    for (int j = i; j < half; ++j) {
      float* a = x + static_cast<int64_t>(h) * head_dim + j * stride;
      float* b = a + other;
      const float c = cs[2 * j], s = cs[2 * j + 1];
      const float x0 = *a, x1 = *b;
      *a = unfused(x0 * c) - unfused(x1 * s);
      *b = unfused(x0 * s) + unfused(x1 * c);
    }
}

void expf_exact_avx2(const float* x, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(out + i, expf_exact(_mm256_loadu_ps(x + i)));
  for (; i < n; ++i) out[i] = std::exp(x[i]);
}

void swiglu_exact_avx2(float* gate, const float* up, int64_t n) {
  // swiglu's g / (1 + expf(-g)) * u, operation for operation.
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i);
    const __m256 e = expf_exact(_mm256_xor_ps(g, _mm256_set1_ps(-0.0f)));  // -g, as the scalar path
    _mm256_storeu_ps(gate + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

}  // namespace tandem::kernels::cpu
