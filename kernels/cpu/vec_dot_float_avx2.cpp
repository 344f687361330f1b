// AVX2+FMA dots for F32, F16 and BF16 weights (activations in the same format). Each 8-wide
// slice of the weight row is loaded and widened once and multiplied into every activation row.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/quants.h"
#include "kernels/cpu/simd_avx2.h"
#include "kernels/cpu/vec_dot.h"

namespace tandem::kernels::cpu {
namespace {

using avx2::hsum;
using avx2::with_rows;

struct f32_format {
  static constexpr size_t bytes = 4;
  static __m256 load8(const uint8_t* p) { return _mm256_loadu_ps(reinterpret_cast<const float*>(p)); }
  static float load1(const uint8_t* p) {
    float f;
    std::memcpy(&f, p, sizeof f);
    return f;
  }
};
struct f16_format {
  static constexpr size_t bytes = 2;
  static __m256 load8(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static float load1(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, sizeof h);
    return _cvtsh_ss(h);
  }
};
struct bf16_format {
  static constexpr size_t bytes = 2;
  static __m256 load8(const uint8_t* p) {
    const __m256i wide = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));  // bf16 is the top half of an f32
  }
  static float load1(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, sizeof h);
    return bf16_to_fp32(h);
  }
};

template <class Fmt>
void dot_float(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out,
               int64_t out_stride) {
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* ab = static_cast<const uint8_t*>(act);
  with_rows(n_act, [&]<int NR>() {
    __m256 acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256 wv = Fmt::load8(wb + i * Fmt::bytes);
      for (int r = 0; r < NR; ++r)
        acc[r] = _mm256_fmadd_ps(wv, Fmt::load8(ab + r * act_stride + i * Fmt::bytes), acc[r]);
    }
    for (int r = 0; r < NR; ++r) {
      float sum = hsum(acc[r]);
      for (int64_t j = i; j < n; ++j) sum += Fmt::load1(wb + j * Fmt::bytes) * Fmt::load1(ab + r * act_stride + j * Fmt::bytes);
      out[r * out_stride] = sum;
    }
  });
}

}  // namespace

void vec_dot_f32_avx2(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out,
                      int64_t out_stride) {
  dot_float<f32_format>(n, w, act, act_stride, n_act, out, out_stride);
}

void vec_dot_f16_avx2(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out,
                      int64_t out_stride) {
  dot_float<f16_format>(n, w, act, act_stride, n_act, out, out_stride);
}

void vec_dot_bf16_avx2(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out,
                       int64_t out_stride) {
  dot_float<bf16_format>(n, w, act, act_stride, n_act, out, out_stride);
}

}  // namespace tandem::kernels::cpu
