// AVX2 dots for the 32-element blocks, as tiles of weight rows x activation rows. A weight
// block decodes to 32 codes in one register, once for all activation rows of the tile, and
// an activation block is loaded once for all weight rows; each (weight row, activation row)
// pair then costs one maddubs + madd (byte products summed into eight int32 lanes) and one
// FMA with the product of the two block scales, into an accumulator of its own, so the
// tile's FMAs do not wait on each other.
#include <immintrin.h>

#include <cmath>

#include "kernels/cpu/simd_avx2.h"
#include "kernels/cpu/vec_dot.h"

namespace tandem::kernels::cpu {
namespace {

using namespace avx2;

// Per weight type: how a block decodes. Q4 / Q5 codes stay unsigned (maddubs wants one
// unsigned operand) and `offset` (8 or 16; 0 for types with an offset m, whose Q8_1 s
// carries it) times the activation sum is taken back per activation block, shared by the
// tile's weight rows. Q8_0 codes are signed and go through dot_i8_i8.
struct q4_0_traits {
  using block = block_q4_0;
  using act_block = block_q8_0;
  static constexpr bool is_signed = false;
  static constexpr int offset = 8;
  static __m256i codes(const block& b) { return unpack_nibbles(b.qs); }
};
struct q5_0_traits {
  using block = block_q5_0;
  using act_block = block_q8_0;
  static constexpr bool is_signed = false;
  static constexpr int offset = 16;
  static __m256i codes(const block& b) { return _mm256_or_si256(unpack_nibbles(b.qs), fifth_bits(b.qh)); }
};
struct q8_0_traits {
  using block = block_q8_0;
  using act_block = block_q8_0;
  static constexpr bool is_signed = true;
  static constexpr int offset = 0;
  static __m256i codes(const block& b) { return load32(b.qs); }
};
struct q4_1_traits {
  using block = block_q4_1;
  using act_block = block_q8_1;
  static constexpr bool is_signed = false;
  static constexpr int offset = 0;
  static __m256i codes(const block& b) { return unpack_nibbles(b.qs); }
};
struct q5_1_traits {
  using block = block_q5_1;
  using act_block = block_q8_1;
  static constexpr bool is_signed = false;
  static constexpr int offset = 0;
  static __m256i codes(const block& b) { return _mm256_or_si256(unpack_nibbles(b.qs), fifth_bits(b.qh)); }
};

// The tile for NR <= 2 activation rows: with NW = 4 that is 8 accumulators next to the
// activation codes, offsets and scales, close to the 16 ymm registers.
template <class T, int NW, int NR>
void tile(int64_t nb, const uint8_t* w, size_t w_stride, const uint8_t* act, size_t act_stride, float* out,
          int64_t out_stride) {
  using block = typename T::block;
  using act_block = typename T::act_block;
  constexpr bool with_m = sizeof(act_block) == sizeof(block_q8_1);
  __m256 acc[NW][NR];
  float min_sum[NW][NR];  // sum of m * s over blocks (types with m only)
  for (int o = 0; o < NW; ++o)
    for (int r = 0; r < NR; ++r) {
      acc[o][r] = _mm256_setzero_ps();
      min_sum[o][r] = 0.0f;
    }
  for (int64_t b = 0; b < nb; ++b) {
    __m256i a[NR], base[NR];
    __m256 dy[NR];
    float sy[NR];
    for (int r = 0; r < NR; ++r) {
      const act_block& y = reinterpret_cast<const act_block*>(act + r * act_stride)[b];
      a[r] = load32(y.qs);
      if constexpr (T::offset != 0) base[r] = dot_u8_i8(_mm256_set1_epi8(T::offset), a[r]);
      dy[r] = _mm256_set1_ps(half_to_float(y.d));
      if constexpr (with_m) sy[r] = half_to_float(y.s);
    }
    for (int o = 0; o < NW; ++o) {
      const block& x = reinterpret_cast<const block*>(w + o * w_stride)[b];
      // The same block of the NW rows after the tile, which matmul reads next: the hardware
      // prefetchers lose track of the tile's interleaved row streams.
      _mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(&x) + NW * w_stride), _MM_HINT_T0);
      const __m256i q = T::codes(x);
      const __m256 dx = _mm256_set1_ps(half_to_float(x.d));
      [[maybe_unused]] __m256i abs_q;
      if constexpr (T::is_signed) abs_q = _mm256_sign_epi8(q, q);
      for (int r = 0; r < NR; ++r) {
        __m256i p;
        if constexpr (T::is_signed) p = dot_i8_i8(q, abs_q, a[r]);
        else p = dot_u8_i8(q, a[r]);
        if constexpr (T::offset != 0) p = _mm256_sub_epi32(p, base[r]);
        acc[o][r] = _mm256_fmadd_ps(_mm256_mul_ps(dx, dy[r]), _mm256_cvtepi32_ps(p), acc[o][r]);
      }
      if constexpr (with_m) {
        const float mx = half_to_float(x.m);
        // Fused, as GCC contracts ggml's `summs += m * s` (and the AVX-512 tiles do).
        for (int r = 0; r < NR; ++r) min_sum[o][r] = std::fma(mx, sy[r], min_sum[o][r]);
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int o = 0; o < NW; ++o) out[r * out_stride + o] = hsum(acc[o][r]) + min_sum[o][r];
}

// A tile of n_w weight rows x n_act activation rows, two activation rows per pass (more
// would not fit the registers); each (weight row, activation row) pair sees the same
// operations in every tile shape.
template <class T>
void dot_legacy(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride, int n_act,
                float* out, int64_t out_stride) {
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* ab = static_cast<const uint8_t*>(act);
  for (int r0 = 0; r0 < n_act; r0 += 2) {
    const int nr = n_act - r0 < 2 ? 1 : 2;
    auto run = [&]<int NW>() {
      const uint8_t* a = ab + r0 * act_stride;
      float* o = out + r0 * out_stride;
      if (nr == 1) tile<T, NW, 1>(n / k_qk_legacy, wb, w_stride, a, act_stride, o, out_stride);
      else tile<T, NW, 2>(n / k_qk_legacy, wb, w_stride, a, act_stride, o, out_stride);
    };
    switch (n_w) {
      case 1: run.template operator()<1>(); break;
      case 2: run.template operator()<2>(); break;
      case 3: run.template operator()<3>(); break;
      default: run.template operator()<4>(); break;
    }
  }
}

}  // namespace

#define TANDEM_LEGACY_AVX2(type)                                                                                   \
  void dot_##type##_avx2(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride,    \
                         int n_act, float* out, int64_t out_stride) {                                              \
    dot_legacy<type##_traits>(n, w, w_stride, n_w, act, act_stride, n_act, out, out_stride);                       \
  }                                                                                                                \
  void vec_dot_##type##_avx2(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out,  \
                             int64_t out_stride) {                                                                 \
    dot_legacy<type##_traits>(n, w, 0, 1, act, act_stride, n_act, out, out_stride);                                \
  }

TANDEM_LEGACY_AVX2(q4_0)
TANDEM_LEGACY_AVX2(q4_1)
TANDEM_LEGACY_AVX2(q5_0)
TANDEM_LEGACY_AVX2(q5_1)
TANDEM_LEGACY_AVX2(q8_0)

#undef TANDEM_LEGACY_AVX2

}  // namespace tandem::kernels::cpu
