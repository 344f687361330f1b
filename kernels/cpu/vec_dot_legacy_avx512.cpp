// AVX-512 VNNI dots for the 32-element blocks, as tiles of NW weight rows x NR activation
// rows.
//
// Results are bit-identical to the AVX2 tiles (vec_dot_legacy_avx2.cpp), which follow
// ggml's x86 order of float operations, so greedy tokens at near-tied logits agree with
// llama.cpp. Per (weight row, activation row) pair that order is one 8-lane float
// accumulator; for each block in turn, int32 lane i holds the exact dot of elements
// 4i..4i+3, and acc = fma(dx * dy, float(lanes), acc); at the end the AVX2 lane sum plus
// (Q4_1 / Q5_1) the sum of m * s over the blocks, each product rounded, added in block order.
//
// So a block's lanes must stay in one 256-bit half in element order, and the speed comes
// from elsewhere: each zmm holds two pairs (two weight rows against one activation row), so
// one vpdpbusd, conversion, multiply and FMA serve both. Every weight code enters vpdpbusd
// as an unsigned byte (Q4 / Q5 codes as stored, Q8_0 codes with the sign bit flipped,
// w + 128); what that offset adds (8, 16 or 128 times the activation codes) depends only on
// the activation block, so it is computed once per activation block and seeds the vpdpbusd
// of every weight row, negated. The integers are exact, so they equal the AVX2 maddubs /
// madd sums; the float operations are the same ones in the same order.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/simd_avx512.h"
#include "kernels/cpu/vec_dot.h"

namespace tandem::kernels::cpu {
namespace {

using namespace avx512;

// The 16 packed bytes of two blocks -> their 32 code bytes each, the first block's in the
// low 256 bits and the second one's in the high ones, in element order: low nibbles are
// elements 0..15, high nibbles 16..31. The broadcasts are pure loads, and the shift of
// the upper 16 bytes is masked rather than shuffled.
inline __m512i unpack_nibbles(const uint8_t* qs0, const uint8_t* qs1) {
  const __m512i both = join(_mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs0))),
                            _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(qs1))));
  return _mm512_and_si512(_mm512_mask_srli_epi16(both, 0xFF00FF00, both, 4), _mm512_set1_epi8(0x0F));
}
// Q5: bit j of a block's qh is the fifth bit (16) of its element j.
inline __m512i add_fifth_bits(__m512i q, const uint8_t* qh0, const uint8_t* qh1) {
  uint32_t b0, b1;
  std::memcpy(&b0, qh0, sizeof b0);
  std::memcpy(&b1, qh1, sizeof b1);
  const __mmask64 k = _cvtu64_mask64(static_cast<uint64_t>(b0) | static_cast<uint64_t>(b1) << 32);
  return _mm512_mask_add_epi8(q, k, q, _mm512_set1_epi8(0x10));
}

// Per weight type: the block, the activation block it meets, the byte added to every code
// to make it unsigned (taken back through the activation sums; 0 for types with m, whose
// Q8_1 s carries the offset), and two blocks' codes as unsigned bytes (unpack_nibbles
// layout).
struct q4_0_traits {
  using block = block_q4_0;
  using act_block = block_q8_0;
  static constexpr char offset = 8;
  static __m512i codes(const block& b0, const block& b1) { return unpack_nibbles(b0.qs, b1.qs); }
};
struct q4_1_traits {
  using block = block_q4_1;
  using act_block = block_q8_1;
  static constexpr char offset = 0;
  static __m512i codes(const block& b0, const block& b1) { return unpack_nibbles(b0.qs, b1.qs); }
};
struct q5_0_traits {
  using block = block_q5_0;
  using act_block = block_q8_0;
  static constexpr char offset = 16;
  static __m512i codes(const block& b0, const block& b1) {
    return add_fifth_bits(unpack_nibbles(b0.qs, b1.qs), b0.qh, b1.qh);
  }
};
struct q5_1_traits {
  using block = block_q5_1;
  using act_block = block_q8_1;
  static constexpr char offset = 0;
  static __m512i codes(const block& b0, const block& b1) {
    return add_fifth_bits(unpack_nibbles(b0.qs, b1.qs), b0.qh, b1.qh);
  }
};
struct q8_0_traits {
  using block = block_q8_0;
  using act_block = block_q8_0;
  static constexpr char offset = static_cast<char>(0x80);
  static __m512i codes(const block& b0, const block& b1) {
    return _mm512_xor_si512(load32x2(b0.qs, b1.qs), _mm512_set1_epi8(offset));
  }
};

// Two pairs per zmm: weight rows 2g and 2g + 1 share one register, row 2g in the low 256
// bits and 2g + 1 in the high ones, and each half is its pair's own 8-lane accumulator, fed
// one block at a time. An odd last row fills both halves; the high one is dropped.
//
// The fp16 scales are converted k_chunk blocks at a time: scalar copies collect them in a
// small buffer (block-major, row-minor), which vcvtph2ps turns into floats 16 at a time; the
// block loop then reads each as a broadcast memory operand instead of converting and
// broadcasting it in the shuffle port.
constexpr int k_chunk = 16;

template <class T, int NW, int NR>
void tile(int64_t nb, const uint8_t* w, size_t w_stride, const uint8_t* act, size_t act_stride, float* out,
          int64_t out_stride) {
  using block = typename T::block;
  using act_block = typename T::act_block;
  constexpr bool with_m = sizeof(act_block) == sizeof(block_q8_1);
  constexpr int NG = (NW + 1) / 2;
  constexpr int W = 4;  // row slots per block in the scale buffers
  __m512 acc[NG][NR];
  __m128 min_sum[NW];  // lane r: sum of m * s over the blocks, weight row o x activation row r
  TANDEM_UNROLL
  for (int g = 0; g < NG; ++g)
    TANDEM_UNROLL
    for (int r = 0; r < NR; ++r) acc[g][r] = _mm512_setzero_ps();
  TANDEM_UNROLL
  for (int o = 0; o < NW; ++o) min_sum[o] = _mm_setzero_ps();
  // The raw fp16 of one chunk, and the floats of two: the next chunk's scales are collected
  // before the current chunk's blocks and converted after them, so the vector load that reads
  // the scalar stores never waits for them. Slot (k, row) at H * (W * k + row) holds H fp16:
  // d, then m (weights) or s (Q8_1) where the type has them; they lead every block, so one
  // copy per block takes both.
  constexpr int H = with_m ? 2 : 1;
  constexpr int slots = k_chunk * W * H;
  alignas(64) uint16_t hx[slots] = {}, hy[slots] = {};
  alignas(64) float fx[2][slots], fy[2][slots];
  auto collect = [&](int64_t b0, int count) {
    for (int k = 0; k < count; ++k) {
      TANDEM_UNROLL
      for (int o = 0; o < NW; ++o) {
        const block& x = reinterpret_cast<const block*>(w + o * w_stride)[b0 + k];
        std::memcpy(hx + H * (W * k + o), &x, H * sizeof(uint16_t));
      }
      TANDEM_UNROLL
      for (int r = 0; r < NR; ++r) {
        const act_block& y = reinterpret_cast<const act_block*>(act + r * act_stride)[b0 + k];
        std::memcpy(hy + H * (W * k + r), &y, H * sizeof(uint16_t));
      }
    }
  };
  auto convert = [&](int set, int count) {
    for (int i = 0; i < count * W * H; i += 16) {
      _mm512_store_ps(fx[set] + i, cvt_f16(load32(hx + i)));
      _mm512_store_ps(fy[set] + i, cvt_f16(load32(hy + i)));
    }
  };
  auto chunk_size = [&](int64_t b0) { return nb - b0 < k_chunk ? static_cast<int>(nb - b0) : k_chunk; };
  if (nb > 0) {
    collect(0, chunk_size(0));
    convert(0, chunk_size(0));
  }
  int set = 0;
  for (int64_t b0 = 0; b0 < nb; b0 += k_chunk, set ^= 1) {
    const int count = chunk_size(b0);
    const int next = b0 + k_chunk < nb ? chunk_size(b0 + k_chunk) : 0;
    if (next > 0) collect(b0 + k_chunk, next);
    const float* xs = fx[set];
    const float* ys = fy[set];
    for (int k = 0; k < count; ++k) {
      const int64_t b = b0 + k;
      __m512i a[NR], seed[NR];
      TANDEM_UNROLL
      for (int r = 0; r < NR; ++r) {
        const act_block& y = reinterpret_cast<const act_block*>(act + r * act_stride)[b];
        a[r] = _mm512_mask_broadcast_i64x4(_mm512_setzero_si512(), 0xFF, load32(y.qs));
        seed[r] = _mm512_setzero_si512();
        if constexpr (T::offset != 0)
          seed[r] = _mm512_sub_epi32(seed[r], _mm512_dpbusd_epi32(seed[r], _mm512_set1_epi8(T::offset), a[r]));
      }
      TANDEM_UNROLL
      for (int g = 0; g < NG; ++g) {
        const int o0 = 2 * g, o1 = 2 * g + 1 < NW ? 2 * g + 1 : 2 * g;
        const block& x0 = reinterpret_cast<const block*>(w + o0 * w_stride)[b];
        const block& x1 = reinterpret_cast<const block*>(w + o1 * w_stride)[b];
        prefetch(&x0, NW * w_stride);
        if (o1 != o0) prefetch(&x1, NW * w_stride);
        const __m512i q = T::codes(x0, x1);
        const __m512 dx = _mm512_mask_broadcastss_ps(_mm512_set1_ps(xs[H * (W * k + o0)]), 0xFF00,
                                                     _mm_load_ss(&xs[H * (W * k + o1)]));
        TANDEM_UNROLL
        for (int r = 0; r < NR; ++r) {
          const __m512i p = _mm512_dpbusd_epi32(seed[r], q, a[r]);
          acc[g][r] = _mm512_fmadd_ps(_mm512_mul_ps(dx, _mm512_set1_ps(ys[H * (W * k + r)])), cvt_i32(p), acc[g][r]);
        }
      }
      if constexpr (with_m) {
        // Per lane m * s fused into the sum: the same roundings as the AVX2 kernel.
        const float* sk = ys + H * W * k;  // d0 s0 d1 s1 d2 s2 d3 s3
        const __m128 s = _mm_shuffle_ps(_mm_load_ps(sk), _mm_load_ps(sk + 4), _MM_SHUFFLE(3, 1, 3, 1));
        TANDEM_UNROLL
        for (int o = 0; o < NW; ++o)
          min_sum[o] = _mm_fmadd_ps(_mm_set1_ps(xs[H * (W * k + o) + 1]), s, min_sum[o]);
      }
    }
    if (next > 0) convert(set ^ 1, next);
  }
  alignas(16) float ms[NW][4];
  for (int o = 0; o < NW; ++o) _mm_store_ps(ms[o], min_sum[o]);
  for (int r = 0; r < NR; ++r)
    for (int o = 0; o < NW; ++o) {
      const __m512 v = acc[o / 2][r];
      // The immediate must be a literal: unoptimised and sanitizer builds do not fold o % 2.
      const __m256 half = o % 2 == 0 ? _mm512_mask_extractf32x8_ps(_mm256_setzero_ps(), 0xFF, v, 0)
                                     : _mm512_mask_extractf32x8_ps(_mm256_setzero_ps(), 0xFF, v, 1);
      out[r * out_stride + o] = hsum(half) + ms[o][r];
    }
}

template <class T>
void dot_legacy(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride, int n_act,
                float* out, int64_t out_stride) {
  with_tile(n_w, n_act, [&]<int NW, int NR>() {
    tile<T, NW, NR>(n / k_qk_legacy, static_cast<const uint8_t*>(w), w_stride, static_cast<const uint8_t*>(act),
                    act_stride, out, out_stride);
  });
}

}  // namespace

void dot_q4_0_avx512(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride,
                     int n_act, float* out, int64_t out_stride) {
  dot_legacy<q4_0_traits>(n, w, w_stride, n_w, act, act_stride, n_act, out, out_stride);
}

void dot_q4_1_avx512(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride,
                     int n_act, float* out, int64_t out_stride) {
  dot_legacy<q4_1_traits>(n, w, w_stride, n_w, act, act_stride, n_act, out, out_stride);
}

void dot_q5_0_avx512(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride,
                     int n_act, float* out, int64_t out_stride) {
  dot_legacy<q5_0_traits>(n, w, w_stride, n_w, act, act_stride, n_act, out, out_stride);
}

void dot_q5_1_avx512(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride,
                     int n_act, float* out, int64_t out_stride) {
  dot_legacy<q5_1_traits>(n, w, w_stride, n_w, act, act_stride, n_act, out, out_stride);
}

void dot_q8_0_avx512(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride,
                     int n_act, float* out, int64_t out_stride) {
  dot_legacy<q8_0_traits>(n, w, w_stride, n_w, act, act_stride, n_act, out, out_stride);
}

}  // namespace tandem::kernels::cpu
