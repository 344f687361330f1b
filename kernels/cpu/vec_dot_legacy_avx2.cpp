// AVX2 dots for the 32-element blocks. A weight block decodes to 32 int8 codes in one
// register; each activation row then costs one maddubs + madd (int8 products summed into
// eight int32 lanes) and one FMA with the product of the two block scales.
#include <immintrin.h>

#include "kernels/cpu/simd_avx2.h"
#include "kernels/cpu/vec_dot.h"

namespace tandem::kernels::cpu {
namespace {

using namespace avx2;

// Per weight type: how a block decodes. `is_signed` codes go through dot_i8_i8; unsigned
// codes (types with an offset m) through dot_u8_i8 plus the m * s term of the Q8_1 block.
struct q4_0_traits {
  using block = block_q4_0;
  using act_block = block_q8_0;
  static constexpr bool is_signed = true;
  static __m256i codes(const block& b) { return _mm256_sub_epi8(unpack_nibbles(b.qs), _mm256_set1_epi8(8)); }
};
struct q5_0_traits {
  using block = block_q5_0;
  using act_block = block_q8_0;
  static constexpr bool is_signed = true;
  static __m256i codes(const block& b) {
    return _mm256_sub_epi8(_mm256_or_si256(unpack_nibbles(b.qs), fifth_bits(b.qh)), _mm256_set1_epi8(16));
  }
};
struct q8_0_traits {
  using block = block_q8_0;
  using act_block = block_q8_0;
  static constexpr bool is_signed = true;
  static __m256i codes(const block& b) { return load32(b.qs); }
};
struct q4_1_traits {
  using block = block_q4_1;
  using act_block = block_q8_1;
  static constexpr bool is_signed = false;
  static __m256i codes(const block& b) { return unpack_nibbles(b.qs); }
};
struct q5_1_traits {
  using block = block_q5_1;
  using act_block = block_q8_1;
  static constexpr bool is_signed = false;
  static __m256i codes(const block& b) { return _mm256_or_si256(unpack_nibbles(b.qs), fifth_bits(b.qh)); }
};

template <class T>
void dot_legacy(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out,
                int64_t out_stride) {
  using act_block = typename T::act_block;
  const auto* x = static_cast<const typename T::block*>(w);
  const auto* ab = static_cast<const uint8_t*>(act);
  const int64_t nb = n / k_qk_legacy;
  with_rows(n_act, [&]<int NR>() {
    const act_block* y[NR];
    __m256 acc[NR];
    float offset[NR];  // sum of m * s over blocks (unsigned types only)
    for (int r = 0; r < NR; ++r) {
      y[r] = reinterpret_cast<const act_block*>(ab + r * act_stride);
      acc[r] = _mm256_setzero_ps();
      offset[r] = 0.0f;
    }
    for (int64_t b = 0; b < nb; ++b) {
      const __m256i q = T::codes(x[b]);
      const float dx = half_to_float(x[b].d);
      if constexpr (T::is_signed) {
        const __m256i abs_q = _mm256_sign_epi8(q, q);
        for (int r = 0; r < NR; ++r) {
          const __m256i p = dot_i8_i8(q, abs_q, load32(y[r][b].qs));
          acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dx * half_to_float(y[r][b].d)), _mm256_cvtepi32_ps(p), acc[r]);
        }
      } else {
        const float mx = half_to_float(x[b].m);
        for (int r = 0; r < NR; ++r) {
          const __m256i p = dot_u8_i8(q, load32(y[r][b].qs));
          acc[r] = _mm256_fmadd_ps(_mm256_set1_ps(dx * half_to_float(y[r][b].d)), _mm256_cvtepi32_ps(p), acc[r]);
          offset[r] += mx * half_to_float(y[r][b].s);
        }
      }
    }
    for (int r = 0; r < NR; ++r) out[r * out_stride] = hsum(acc[r]) + offset[r];
  });
}

}  // namespace

void vec_dot_q4_0_avx2(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out,
                       int64_t out_stride) {
  dot_legacy<q4_0_traits>(n, w, act, act_stride, n_act, out, out_stride);
}

void vec_dot_q4_1_avx2(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out,
                       int64_t out_stride) {
  dot_legacy<q4_1_traits>(n, w, act, act_stride, n_act, out, out_stride);
}

void vec_dot_q5_0_avx2(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out,
                       int64_t out_stride) {
  dot_legacy<q5_0_traits>(n, w, act, act_stride, n_act, out, out_stride);
}

void vec_dot_q5_1_avx2(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out,
                       int64_t out_stride) {
  dot_legacy<q5_1_traits>(n, w, act, act_stride, n_act, out, out_stride);
}

void vec_dot_q8_0_avx2(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out,
                       int64_t out_stride) {
  dot_legacy<q8_0_traits>(n, w, act, act_stride, n_act, out, out_stride);
}

}  // namespace tandem::kernels::cpu
