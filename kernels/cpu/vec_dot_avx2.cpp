// The AVX2+FMA row tiles of vec_dot.h: float weights, the 32-element blocks, the K-quants.
#include <immintrin.h>

#include <cmath>
#include <cstring>

#include "kernels/cpu/quants.h"
#include "kernels/cpu/simd_avx2.h"
#include "kernels/cpu/vec_dot.h"

namespace tandem::kernels::cpu {

// AVX2+FMA dots for F32, F16 and BF16 weights (activations in the same format). Each 8-wide
// slice of the weight row is loaded and widened once and multiplied into every activation row.

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
void dot_float(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out, int64_t out_stride) {
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* ab = static_cast<const uint8_t*>(act);
  with_rows(n_act, [&]<int NR>() {
    __m256 acc[NR];
    for (int r = 0; r < NR; ++r) acc[r] = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
      const __m256 wv = Fmt::load8(wb + i * Fmt::bytes);
      for (int r = 0; r < NR; ++r) acc[r] = _mm256_fmadd_ps(wv, Fmt::load8(ab + r * act_stride + i * Fmt::bytes), acc[r]);
    }
    for (int r = 0; r < NR; ++r) {
      float sum = hsum(acc[r]);
      for (int64_t j = i; j < n; ++j) sum += Fmt::load1(wb + j * Fmt::bytes) * Fmt::load1(ab + r * act_stride + j * Fmt::bytes);
      out[r * out_stride] = sum;
    }
  });
}

}  // namespace

void vec_dot_f32_avx2(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out, int64_t out_stride) {
  dot_float<f32_format>(n, w, act, act_stride, n_act, out, out_stride);
}

void vec_dot_f16_avx2(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out, int64_t out_stride) {
  dot_float<f16_format>(n, w, act, act_stride, n_act, out, out_stride);
}

void vec_dot_bf16_avx2(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out, int64_t out_stride) {
  dot_float<bf16_format>(n, w, act, act_stride, n_act, out, out_stride);
}

// AVX2 dots for the 32-element blocks, as tiles of weight rows x activation rows. A weight
// block decodes to 32 codes in one register, once for all activation rows of the tile, and
// an activation block is loaded once for all weight rows; each (weight row, activation row)
// pair then costs one maddubs + madd (byte products summed into eight int32 lanes) and one
// FMA with the product of the two block scales, into an accumulator of its own, so the
// tile's FMAs do not wait on each other.

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
void tile(int64_t nb, const uint8_t* w, size_t w_stride, const uint8_t* act, size_t act_stride, float* out, int64_t out_stride) {
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
        if constexpr (T::is_signed)
          p = dot_i8_i8(q, abs_q, a[r]);
        else
          p = dot_u8_i8(q, a[r]);
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
void dot_legacy(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride, int n_act, float* out, int64_t out_stride) {
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* ab = static_cast<const uint8_t*>(act);
  for (int r0 = 0; r0 < n_act; r0 += 2) {
    const int nr = n_act - r0 < 2 ? 1 : 2;
    auto run = [&]<int NW>() {
      const uint8_t* a = ab + r0 * act_stride;
      float* o = out + r0 * out_stride;
      if (nr == 1)
        tile<T, NW, 1>(n / k_qk_legacy, wb, w_stride, a, act_stride, o, out_stride);
      else
        tile<T, NW, 2>(n / k_qk_legacy, wb, w_stride, a, act_stride, o, out_stride);
    };
    switch (n_w) {
      case 1:
        run.template operator()<1>();
        break;
      case 2:
        run.template operator()<2>();
        break;
      case 3:
        run.template operator()<3>();
        break;
      default:
        run.template operator()<4>();
        break;
    }
  }
}

}  // namespace

#define TANDEM_LEGACY_AVX2(type)                                                                                                        \
  void dot_##type##_avx2(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride, int n_act, float* out, \
                         int64_t out_stride) {                                                                                          \
    dot_legacy<type##_traits>(n, w, w_stride, n_w, act, act_stride, n_act, out, out_stride);                                            \
  }                                                                                                                                     \
  void vec_dot_##type##_avx2(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out, int64_t out_stride) { \
    dot_legacy<type##_traits>(n, w, 0, 1, act, act_stride, n_act, out, out_stride);                                                     \
  }

TANDEM_LEGACY_AVX2(q4_0)
TANDEM_LEGACY_AVX2(q4_1)
TANDEM_LEGACY_AVX2(q5_0)
TANDEM_LEGACY_AVX2(q5_1)
TANDEM_LEGACY_AVX2(q8_0)

#undef TANDEM_LEGACY_AVX2

// AVX2 dots for the K-quants against Q8_K activations. Codes are unsigned (0..15, 0..31,
// 0..63), so maddubs takes them directly; the sub-block scale rides in the following madd,
// and integer sums stay in eight int32 lanes for the whole 256-element super-block. Offsets
// (Q4_K/Q5_K mins, Q6_K's -32) are applied through the activation's per-16 sums (bsums).
//
// Bounds: maddubs pairs are at most 2*63*127 = 16002 (< int16 max); per super-block a lane
// holds at most 8 * 4 * 63 * 127 * 127 < 2^31 (Q6_K, the widest case).

namespace {

using namespace avx2;

template <bool five_bit, class Block>
void dot_k_affine(int64_t n, const Block* x, const uint8_t* ab, size_t act_stride, int n_act, float* out, int64_t out_stride) {
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

void dot_q6_k(int64_t n, const block_q6_k* x, const uint8_t* ab, size_t act_stride, int n_act, float* out, int64_t out_stride) {
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
        v[1] = _mm256_or_si256(_mm256_and_si256(q1, low4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), low2), 4));
        v[2] =
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q0, 4), low4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), low2), 4));
        v[3] =
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(q1, 4), low4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), low2), 4));
        for (int k = 0; k < 4; ++k) {
          // Bytes 0..15 belong to sub-block 2k of the half, bytes 16..31 to 2k+1.
          const int s = 8 * h + 2 * k;
          const __m256i scale = _mm256_set_m128i(_mm_set1_epi16(sc[s + 1]), _mm_set1_epi16(sc[s]));
          for (int r = 0; r < NR; ++r) isum[r] = _mm256_add_epi32(isum[r], dot_u8_i8_scaled(v[k], load32(y[r][b].qs + 128 * h + 32 * k), scale));
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

void vec_dot_q4_k_avx2(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out, int64_t out_stride) {
  dot_k_affine<false>(n, static_cast<const block_q4_k*>(w), static_cast<const uint8_t*>(act), act_stride, n_act, out, out_stride);
}

void vec_dot_q5_k_avx2(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out, int64_t out_stride) {
  dot_k_affine<true>(n, static_cast<const block_q5_k*>(w), static_cast<const uint8_t*>(act), act_stride, n_act, out, out_stride);
}

void vec_dot_q6_k_avx2(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out, int64_t out_stride) {
  dot_q6_k(n, static_cast<const block_q6_k*>(w), static_cast<const uint8_t*>(act), act_stride, n_act, out, out_stride);
}

}  // namespace tandem::kernels::cpu
