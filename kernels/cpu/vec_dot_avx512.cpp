// The AVX-512 row tiles of vec_dot.h: float weights, the 32-element blocks (VNNI), the
// K-quants (VNNI).
#include <immintrin.h>

#include <array>
#include <cstring>

#include "kernels/cpu/packed.h"
#include "kernels/cpu/simd_avx512.h"
#include "kernels/cpu/vec_dot.h"

namespace tandem::kernels::cpu {

// AVX-512 dots for F32, F16 and BF16 weights (activations in the same format), as tiles of
// NW weight rows x NR activation rows: each 64-byte slice of a weight row is loaded and
// widened once for all NR activation rows, and each activation slice once for all NW weight
// rows. A row length that is not a multiple of the slice ends with one masked (zero-filled)
// slice.

namespace {

using namespace avx512;

// Per format: a slice is the elements in 64 bytes of a row (one cache line when aligned),
// as the operand of madd, loaded whole or as its first k elements (zeros after them).
struct f32_format {
  static constexpr int64_t width = 16;
  static constexpr size_t bytes = 4;
  using slice = __m512;
  static slice load(const uint8_t* p) { return _mm512_loadu_ps(p); }
  static slice load_first(const uint8_t* p, int64_t k) { return _mm512_maskz_loadu_ps(first16(k), p); }
  static __m512 madd(__m512 acc, slice w, slice a) { return _mm512_fmadd_ps(w, a, acc); }
};

// fp16 x fp16 products are exact in float, so each FMA rounds once per element, like the
// scalar reference's float product summed in double up to the accumulation order.
struct f16_format {
  static constexpr int64_t width = 32;
  static constexpr size_t bytes = 2;
  struct slice {
    __m512 lo, hi;
  };
  static slice load(const uint8_t* p) { return {cvt_f16(load32(p)), cvt_f16(load32(p + 32))}; }
  static slice load_first(const uint8_t* p, int64_t k) {
    const __m512i h = _mm512_maskz_loadu_epi16(first32(k), p);
    return {cvt_f16(low_half(h)), cvt_f16(high_half(h))};
  }
  static __m512 madd(__m512 acc, const slice& w, const slice& a) { return _mm512_fmadd_ps(w.hi, a.hi, _mm512_fmadd_ps(w.lo, a.lo, acc)); }
};

// vdpbf16ps: lane i gains w[2i] * a[2i] + w[2i+1] * a[2i+1].
struct bf16_format {
  static constexpr int64_t width = 32;
  static constexpr size_t bytes = 2;
  using slice = __m512bh;
  static slice load(const uint8_t* p) { return reinterpret_cast<__m512bh>(load64(p)); }
  static slice load_first(const uint8_t* p, int64_t k) { return reinterpret_cast<__m512bh>(_mm512_maskz_loadu_epi16(first32(k), p)); }
  static __m512 madd(__m512 acc, slice w, slice a) { return _mm512_dpbf16_ps(acc, w, a); }
};

// How many tiles ahead the L2 requests go (an Intel Xeon's F16 decode ran ~11% faster with
// them; 2, 4 and 8 tiles measured alike).
constexpr size_t k_far_tiles = 4;

template <class Fmt, int NW, int NR>
void float_tile(int64_t n, const uint8_t* w, size_t w_stride, const uint8_t* act, size_t act_stride, float* out, int64_t out_stride) {
  static_assert(Fmt::width * Fmt::bytes == 64);
  __m512 acc[NW][NR];
  TANDEM_UNROLL
  for (int o = 0; o < NW; ++o) TANDEM_UNROLL
  for (int r = 0; r < NR; ++r) acc[o][r] = _mm512_setzero_ps();
  // Where the CPU's own prefetchers do not keep up (not AMD: packed.h), the same lines
  // k_far_tiles tiles on are asked into L2 as well, as the packed kernels ask.
  const bool far = !g_packed_self_streaming;
  auto step = [&](int64_t i, auto load) {
    typename Fmt::slice ws[NW];
    TANDEM_UNROLL
    for (int o = 0; o < NW; ++o) ws[o] = load(w + o * w_stride + i * Fmt::bytes);
    TANDEM_UNROLL
    for (int r = 0; r < NR; ++r) {
      const typename Fmt::slice as = load(act + r * act_stride + i * Fmt::bytes);
      TANDEM_UNROLL
      for (int o = 0; o < NW; ++o) acc[o][r] = Fmt::madd(acc[o][r], ws[o], as);
    }
  };
  int64_t i = 0;
  for (; i + Fmt::width <= n; i += Fmt::width) {
    // The same line of the NW rows after the tile, which matmul reads next: the hardware
    // prefetchers lose track of the tile's interleaved row streams (see the legacy dots).
    TANDEM_UNROLL
    for (int o = 0; o < NW; ++o) prefetch(w + o * w_stride + i * Fmt::bytes, NW * w_stride);
    if (far) {
      TANDEM_UNROLL
      for (int o = 0; o < NW; ++o) prefetch_l2(w + o * w_stride + i * Fmt::bytes, k_far_tiles * NW * w_stride);
    }
    step(i, [](const uint8_t* p) { return Fmt::load(p); });
  }
  if (i < n) step(i, [k = n - i](const uint8_t* p) { return Fmt::load_first(p, k); });
  store_tile<NW, NR>(acc, out, out_stride);
}

template <class Fmt>
void dot_float(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride, int n_act, float* out, int64_t out_stride) {
  with_tile(n_w, n_act, [&]<int NW, int NR>() {
    float_tile<Fmt, NW, NR>(n, static_cast<const uint8_t*>(w), w_stride, static_cast<const uint8_t*>(act), act_stride, out, out_stride);
  });
}

}  // namespace

void dot_f32_avx512(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride, int n_act, float* out,
                    int64_t out_stride) {
  dot_float<f32_format>(n, w, w_stride, n_w, act, act_stride, n_act, out, out_stride);
}

void dot_f16_avx512(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride, int n_act, float* out,
                    int64_t out_stride) {
  dot_float<f16_format>(n, w, w_stride, n_w, act, act_stride, n_act, out, out_stride);
}

void dot_bf16_avx512(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride, int n_act, float* out,
                     int64_t out_stride) {
  dot_float<bf16_format>(n, w, w_stride, n_w, act, act_stride, n_act, out, out_stride);
}

// AVX-512 VNNI dots for the 32-element blocks, as tiles of NW weight rows x NR activation
// rows.
//
// Results are bit-identical to the AVX2 tiles (vec_dot_avx2.cpp), which follow
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
  static __m512i codes(const block& b0, const block& b1) { return add_fifth_bits(unpack_nibbles(b0.qs, b1.qs), b0.qh, b1.qh); }
};
struct q5_1_traits {
  using block = block_q5_1;
  using act_block = block_q8_1;
  static constexpr char offset = 0;
  static __m512i codes(const block& b0, const block& b1) { return add_fifth_bits(unpack_nibbles(b0.qs, b1.qs), b0.qh, b1.qh); }
};
struct q8_0_traits {
  using block = block_q8_0;
  using act_block = block_q8_0;
  static constexpr char offset = static_cast<char>(0x80);
  static __m512i codes(const block& b0, const block& b1) { return _mm512_xor_si512(load32x2(b0.qs, b1.qs), _mm512_set1_epi8(offset)); }
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
void tile(int64_t nb, const uint8_t* w, size_t w_stride, const uint8_t* act, size_t act_stride, float* out, int64_t out_stride) {
  using block = typename T::block;
  using act_block = typename T::act_block;
  constexpr bool with_m = sizeof(act_block) == sizeof(block_q8_1);
  constexpr int NG = (NW + 1) / 2;
  constexpr int W = 4;  // row slots per block in the scale buffers
  __m512 acc[NG][NR];
  __m128 min_sum[NW];  // lane r: sum of m * s over the blocks, weight row o x activation row r
  TANDEM_UNROLL
  for (int g = 0; g < NG; ++g) TANDEM_UNROLL
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
        if constexpr (T::offset != 0) seed[r] = _mm512_sub_epi32(seed[r], _mm512_dpbusd_epi32(seed[r], _mm512_set1_epi8(T::offset), a[r]));
      }
      TANDEM_UNROLL
      for (int g = 0; g < NG; ++g) {
        const int o0 = 2 * g, o1 = 2 * g + 1 < NW ? 2 * g + 1 : 2 * g;
        const block& x0 = reinterpret_cast<const block*>(w + o0 * w_stride)[b];
        const block& x1 = reinterpret_cast<const block*>(w + o1 * w_stride)[b];
        prefetch(&x0, NW * w_stride);
        if (o1 != o0) prefetch(&x1, NW * w_stride);
        const __m512i q = T::codes(x0, x1);
        const __m512 dx = _mm512_mask_broadcastss_ps(_mm512_set1_ps(xs[H * (W * k + o0)]), 0xFF00, _mm_load_ss(&xs[H * (W * k + o1)]));
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
        for (int o = 0; o < NW; ++o) min_sum[o] = _mm_fmadd_ps(_mm_set1_ps(xs[H * (W * k + o) + 1]), s, min_sum[o]);
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
      const __m256 half =
          o % 2 == 0 ? _mm512_mask_extractf32x8_ps(_mm256_setzero_ps(), 0xFF, v, 0) : _mm512_mask_extractf32x8_ps(_mm256_setzero_ps(), 0xFF, v, 1);
      out[r * out_stride + o] = hsum(half) + ms[o][r];
    }
}

template <class T>
void dot_legacy(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride, int n_act, float* out, int64_t out_stride) {
  with_tile(n_w, n_act, [&]<int NW, int NR>() {
    tile<T, NW, NR>(n / k_qk_legacy, static_cast<const uint8_t*>(w), w_stride, static_cast<const uint8_t*>(act), act_stride, out, out_stride);
  });
}

}  // namespace

void dot_q4_0_avx512(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride, int n_act, float* out,
                     int64_t out_stride) {
  dot_legacy<q4_0_traits>(n, w, w_stride, n_w, act, act_stride, n_act, out, out_stride);
}

void dot_q4_1_avx512(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride, int n_act, float* out,
                     int64_t out_stride) {
  dot_legacy<q4_1_traits>(n, w, w_stride, n_w, act, act_stride, n_act, out, out_stride);
}

void dot_q5_0_avx512(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride, int n_act, float* out,
                     int64_t out_stride) {
  dot_legacy<q5_0_traits>(n, w, w_stride, n_w, act, act_stride, n_act, out, out_stride);
}

void dot_q5_1_avx512(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride, int n_act, float* out,
                     int64_t out_stride) {
  dot_legacy<q5_1_traits>(n, w, w_stride, n_w, act, act_stride, n_act, out, out_stride);
}

void dot_q8_0_avx512(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride, int n_act, float* out,
                     int64_t out_stride) {
  dot_legacy<q8_0_traits>(n, w, w_stride, n_w, act, act_stride, n_act, out, out_stride);
}

// AVX-512 VNNI tiles for the K-quants against Q8_K activations.
//
// Each weight block is decoded once per call into four registers of unsigned codes, 64 each
// in element order (so they meet the activation bytes as they lie in memory), plus its scales
// as vpermw-spread words, and is then reused for every activation row of the tile; each
// activation block is a direct memory operand, shared by every weight row.
//
// Integer path per (weight row, activation row, super-block):
//   vpdpbusd   codes (u8) x activations (s8): each int32 lane sums 4 products, at most
//              4 * 63 * 128 = 32256 in magnitude, so it fits in int16;
//   vpackssdw  two such registers into one of int16 (never saturates, see above);
//   vpdpwssd   the int16 sums times the int16 sub-block scales, summed into int32.
// That is the exact integer of the scalar kernel: sum of scale * (code . activation), with
// Q4_K/Q5_K mins and Q6_K's -32 applied through the activation's bsums as there. Per super-
// block the int32 lanes stay below 256 * 128 * 63 * 128 < 2^31 (Q6_K, the widest case).
// Then one int->float conversion and one FMA per pair and super-block; for Q4_K/Q5_K the
// even lanes carry the scaled sums (times d) and the odd lanes the mins (times dmin), so
// both share them. Results differ from the scalar kernel only in float summation order.
//
// Every (weight row, activation row) pair has its own accumulator and the same sequence of
// operations whatever the tile shape, so a tile equals single-pair calls bit for bit.

namespace {

// GCC 12 reports -Wuninitialized (a false positive) from inside the unmasked forms of several
// AVX-512 intrinsics, which pass _mm512_undefined_*() as their merge source. The zero-masking
// forms with an all-ones mask name a defined source and compile to the same instructions.
constexpr __mmask8 k_all8 = 0xFF;
constexpr __mmask16 k_all16 = 0xFFFF;

static inline __m512i both_halves(__m256i v) { return _mm512_maskz_broadcast_i64x4(k_all8, v); }
static inline __m512 to_float(__m512i v) { return _mm512_maskz_cvtepi32_ps(k_all16, v); }
// Per-qword shifts and rotates (variable counts, or an immediate count of n).
static inline __m512i qword_srlv(__m512i v, __m512i n) { return _mm512_maskz_srlv_epi64(k_all8, v, n); }
static inline __m512i qword_sllv(__m512i v, __m512i n) { return _mm512_maskz_sllv_epi64(k_all8, v, n); }
static inline __m512i qword_rolv(__m512i v, __m512i n) { return _mm512_maskz_rolv_epi64(k_all8, v, n); }
template <unsigned n>
static inline __m512i qword_srli(__m512i v) {
  return _mm512_maskz_srli_epi64(k_all8, v, n);
}
template <unsigned n>
static inline __m512i qword_slli(__m512i v) {
  return _mm512_maskz_slli_epi64(k_all8, v, n);
}

// Decode is bound by memory latency unless each weight row asks for its blocks well ahead
// (measured: about 1.5x the throughput of hardware prefetching alone). A tile streams NW
// rows, and in matmul the next tile starts NW rows further on, so each stream runs on into
// the same row of the following tiles: k_prefetch_blocks ahead in that sense, whatever the
// row length. Prefetching past the matrix is harmless: a prefetch never faults.
constexpr int64_t k_prefetch_blocks = 8;

template <class Block>
class prefetch_cursor {
 public:
  // nb: blocks per row; tile_bytes: distance from a row to the same row of the next tile.
  prefetch_cursor(int64_t nb, size_t tile_bytes)
      : nb_(nb), tile_bytes_(tile_bytes), tiles_(nb > 0 ? k_prefetch_blocks / nb : 0), block_(nb > 0 ? k_prefetch_blocks % nb : 0) {}

  // Prefetches the block ahead of the current one in `row`.
  void fetch(const Block* row) const {
    const uintptr_t p =
        reinterpret_cast<uintptr_t>(row) + static_cast<uintptr_t>(tiles_) * tile_bytes_ + static_cast<uintptr_t>(block_) * sizeof(Block);
    for (size_t off = 0; off < sizeof(Block); off += 64) _mm_prefetch(reinterpret_cast<const char*>(p + off), _MM_HINT_T0);
  }
  // Moves to the next block.
  void advance() {
    if (++block_ == nb_) {
      block_ = 0;
      ++tiles_;
    }
  }

 private:
  int64_t nb_;
  size_t tile_bytes_;
  int64_t tiles_;  // whole tiles ahead
  int64_t block_;  // block within the row of that tile
};

static inline float sum_lanes(__m512 v) {
  const __m256 s8 = _mm256_add_ps(_mm512_maskz_extractf32x8_ps(k_all8, v, 0), _mm512_maskz_extractf32x8_ps(k_all8, v, 1));
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// A decoded weight block: q[i] meets activation bytes 64i..64i+63 of the super-block.
// scale[j] holds the int16 sub-block scales laid out as vpackssdw(q[2j] . a, q[2j+1] . a)
// leaves the sums: 128-bit lane k holds 4 words from q[2j]'s lane k, then 4 from q[2j+1]'s.
struct coded_block {
  __m512i q[4];
  __m512i scale[2];
};

// Sum over the super-block of scale * (codes . activations), in 16 int32 lanes.
static inline __m512i scaled_sum(const coded_block& w, const int8_t* a) {
  const __m512i z = _mm512_setzero_si512();
  const __m512i p0 = _mm512_dpbusd_epi32(z, w.q[0], avx512::load64(a));
  const __m512i p1 = _mm512_dpbusd_epi32(z, w.q[1], avx512::load64(a + 64));
  const __m512i p2 = _mm512_dpbusd_epi32(z, w.q[2], avx512::load64(a + 128));
  const __m512i p3 = _mm512_dpbusd_epi32(z, w.q[3], avx512::load64(a + 192));
  const __m512i s = _mm512_dpwssd_epi32(z, _mm512_packs_epi32(p0, p1), w.scale[0]);
  return _mm512_dpwssd_epi32(s, _mm512_packs_epi32(p2, p3), w.scale[1]);
}

// Word-index tables for vpermw, built at compile time from the layout rules above.
using perm_words = std::array<int16_t, 32>;

// Q4_K / Q5_K: scales come as words [sc0..sc7, m0..m7]. q[2p] holds sub-blocks 4p (lanes
// 0-1) and 4p+1 (lanes 2-3); q[2p+1] holds 4p+2 and 4p+3.
constexpr perm_words affine_scale_index(int p) {
  perm_words idx{};
  for (int i = 0; i < 32; ++i) {
    const int lane = i / 8, word = i % 8;
    idx[i] = static_cast<int16_t>(4 * p + (lane < 2 ? 0 : 1) + (word < 4 ? 0 : 2));
  }
  return idx;
}
// The mins against spread_neg_bsums: m_j at words 4j+2 and 4j+3 (the even dwords meet zeros).
constexpr perm_words affine_min_index() {
  perm_words idx{};
  for (int i = 0; i < 32; ++i) idx[i] = static_cast<int16_t>(8 + i / 4);
  return idx;
}
// Q6_K: scales come as words sc0..sc15 (one per 16 elements). q[2h] holds elements
// 128h + 0..63, one 16-element sub-block per lane (8h + lane); q[2h+1] holds 8h + 4 + lane.
constexpr perm_words q6_scale_index(int h) {
  perm_words idx{};
  for (int i = 0; i < 32; ++i) {
    const int lane = i / 8, word = i % 8;
    idx[i] = static_cast<int16_t>(8 * h + lane + (word < 4 ? 0 : 4));
  }
  return idx;
}

alignas(64) constexpr perm_words k_affine_scale0 = affine_scale_index(0);
alignas(64) constexpr perm_words k_affine_scale1 = affine_scale_index(1);
alignas(64) constexpr perm_words k_affine_min = affine_min_index();
alignas(64) constexpr perm_words k_q6_scale0 = q6_scale_index(0);
alignas(64) constexpr perm_words k_q6_scale1 = q6_scale_index(1);

static inline __m512i load_index(const perm_words& idx) { return _mm512_load_si512(idx.data()); }

// The 12 packed bytes of 6-bit scales and mins -> 16 words [sc0..sc7, m0..m7]. Reads 16
// bytes from `scales`; the 4 past the field are the block's codes and are discarded.
// Bytes 0-3 hold sc0-3 (low 6 bits) and the top 2 bits of sc4-7; bytes 4-7 the same for the
// mins; bytes 8-11 the low nibbles of sc4-7 and, in their high nibbles, of m4-7.
static inline __m256i unpack_affine_scales(const uint8_t* scales) {
  const __m128i raw = _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales));
  // Dwords [b0-3, b8-11, b4-7, b8-11 >> 4]: sc0-3, sc4-7, m0-3, m4-7 before their top bits.
  const __m128i low = _mm_and_si128(_mm_srlv_epi32(_mm_shuffle_epi32(raw, _MM_SHUFFLE(2, 1, 2, 0)), _mm_setr_epi32(0, 0, 0, 4)),
                                    _mm_setr_epi32(0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F));
  // Bits 6-7 of bytes 0-3 (4-7) become bits 4-5 of sc4-7 (m4-7); the mask drops what the
  // dword shift pulls in from the neighbouring byte.
  const __m128i top = _mm_and_si128(_mm_srli_epi32(_mm_shuffle_epi32(raw, _MM_SHUFFLE(1, 0, 0, 0)), 2), _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
  return _mm256_cvtepu8_epi16(_mm_or_si128(low, top));
}

// Q4_K / Q5_K block: codes and scales, the mins as words against the bsums in the layout
// of spread_bsums (m_j at words 4j+2, 4j+3), and {d, dmin} repeated as floats.
struct affine_block {
  coded_block c;
  __m512i mins;
  __m512 d;
};

// Minus bsums pair j (both halves of sub-block j) in dword 2j+1, zeros in the even dwords:
// the min term enters the float sum negated, so one multiplier {d, dmin} serves both.
static inline __m512i spread_neg_bsums(const int16_t* bsums) {
  const __m512i spread = qword_slli<32>(_mm512_maskz_cvtepu32_epi64(k_all8, avx512::load32(bsums)));
  return _mm512_sub_epi16(_mm512_setzero_si512(), spread);
}

template <bool five_bit, class Block>
static inline void decode_affine(const Block& x, affine_block& out, __m512i scale_idx0, __m512i scale_idx1, __m512i min_idx) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  // Chunk c (32 bytes) holds element 64c + l in the low nibble of byte l and 64c + 32 + l in
  // the high one: with the chunk in both register halves, shifting the upper half's qwords
  // by 4 leaves elements 64c .. 64c + 63 in order once masked.
  const __m512i nibble_shift = _mm512_setr_epi64(0, 0, 0, 0, 4, 4, 4, 4);
  __m512i qh = _mm512_setzero_si512();
  if constexpr (five_bit) qh = both_halves(avx512::load32(x.qh));
  for (int c = 0; c < 4; ++c) {
    const __m512i nibbles = qword_srlv(both_halves(avx512::load32(x.qs + 32 * c)), nibble_shift);
    if constexpr (five_bit) {
      // Bit 2c of qh[l] is the fifth bit of element 64c + l, bit 2c+1 that of 64c + 32 + l:
      // rotate each half's bit to bit 4 (bits that cross bytes land elsewhere, masked off).
      const int lo = (4 - 2 * c) & 63, hi = (3 - 2 * c) & 63;
      const __m512i top = _mm512_and_si512(qword_rolv(qh, _mm512_setr_epi64(lo, lo, lo, lo, hi, hi, hi, hi)), _mm512_set1_epi8(0x10));
      out.c.q[c] = _mm512_ternarylogic_epi32(nibbles, top, low4, 0xEC);  // (a & c) | b
    } else {
      out.c.q[c] = _mm512_and_si512(nibbles, low4);
    }
  }
  const __m512i words = _mm512_castsi256_si512(unpack_affine_scales(x.scales));
  out.c.scale[0] = _mm512_permutexvar_epi16(scale_idx0, words);
  out.c.scale[1] = _mm512_permutexvar_epi16(scale_idx1, words);
  out.mins = _mm512_permutexvar_epi16(min_idx, words);
  // d and dmin are adjacent fp16: one dword broadcast converts to {d, dmin} x 8.
  uint32_t dd;
  std::memcpy(&dd, x.d, sizeof dd);
  out.d = _mm512_maskz_cvtph_ps(k_all16, _mm256_set1_epi32(static_cast<int>(dd)));
}

template <bool five_bit, class Block>
void dot_affine_tile(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride, int n_act, float* out,
                     int64_t out_stride) {
  const int64_t nb = n / k_qk_k;
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* ab = static_cast<const uint8_t*>(act);
  avx512::with_tile(n_w, n_act, [&]<int NW, int NR>() {
    const Block* x[NW];
    const block_q8_k* y[NR];
    for (int o = 0; o < NW; ++o) x[o] = reinterpret_cast<const Block*>(wb + o * w_stride);
    for (int r = 0; r < NR; ++r) y[r] = reinterpret_cast<const block_q8_k*>(ab + r * act_stride);
    const __m512i scale_idx0 = load_index(k_affine_scale0);
    const __m512i scale_idx1 = load_index(k_affine_scale1);
    const __m512i min_idx = load_index(k_affine_min);
    __m512 acc[NW][NR];
#pragma GCC unroll 4
    for (int o = 0; o < NW; ++o)
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) acc[o][r] = _mm512_setzero_ps();
    prefetch_cursor<Block> ahead(nb, NW * w_stride);
    for (int64_t b = 0; b < nb; ++b, ahead.advance()) {
      for (int o = 0; o < NW; ++o) ahead.fetch(x[o]);
      __m512i neg_bsums[NR];
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) neg_bsums[r] = spread_neg_bsums(y[r][b].bsums);
#pragma GCC unroll 4
      for (int o = 0; o < NW; ++o) {
        affine_block xb;
        decode_affine<five_bit>(x[o][b], xb, scale_idx0, scale_idx1, min_idx);
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) {
          const __m512i s = scaled_sum(xb.c, y[r][b].qs);
          // Even lanes (times d): s[2i] + s[2i+1]; odd lanes (times dmin): minus the min sums.
          const __m512i both = _mm512_mask_add_epi32(_mm512_madd_epi16(neg_bsums[r], xb.mins), 0x5555, s, qword_srli<32>(s));
          acc[o][r] = _mm512_fmadd_ps(to_float(both), _mm512_mul_ps(xb.d, _mm512_set1_ps(y[r][b].d)), acc[o][r]);
        }
      }
    }
#pragma GCC unroll 4
    for (int o = 0; o < NW; ++o)
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) out[r * out_stride + o] = sum_lanes(acc[o][r]);
  });
}

// Q6_K block: codes and scales, -32 * scale as words against bsums[0..15] (upper half zero),
// and d.
struct q6_block {
  coded_block c;
  __m512i offset;
  __m512 d;
};

static inline void decode_q6(const block_q6_k& x, q6_block& out, __m512i scale_idx0, __m512i scale_idx1) {
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i bits45 = _mm512_set1_epi8(0x30);
  // Per half h and lane l: ql[l] low/high nibble = elements l / l + 64, ql[l + 32] low/high =
  // l + 32 / l + 96; qh[l] bits 0-1, 2-3, 4-5, 6-7 are the top bits of l, l + 32, l + 64,
  // l + 96. With qh in both register halves, per-half shifts bring each pair to bits 4-5
  // (bits crossing bytes land outside 4-5 and are masked off).
  const __m512i shift_lo = _mm512_setr_epi64(4, 4, 4, 4, 2, 2, 2, 2);
  const __m512i shift_hi = _mm512_setr_epi64(0, 0, 0, 0, 2, 2, 2, 2);
  for (int h = 0; h < 2; ++h) {
    const __m512i raw = avx512::load64(x.ql + 64 * h);
    const __m512i qh = both_halves(avx512::load32(x.qh + 32 * h));
    const __m512i top_lo = _mm512_and_si512(qword_sllv(qh, shift_lo), bits45);
    const __m512i top_hi = _mm512_and_si512(qword_srlv(qh, shift_hi), bits45);
    // (a & c) | b
    out.c.q[2 * h] = _mm512_ternarylogic_epi32(raw, top_lo, low4, 0xEC);
    out.c.q[2 * h + 1] = _mm512_ternarylogic_epi32(_mm512_srli_epi16(raw, 4), top_hi, low4, 0xEC);
  }
  // sc0..sc15 as words, zeros above.
  const __m128i sc = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x.scales));
  const __m512i words = _mm512_maskz_cvtepi8_epi16(0xFFFF, _mm256_castsi128_si256(sc));
  out.c.scale[0] = _mm512_permutexvar_epi16(scale_idx0, words);
  out.c.scale[1] = _mm512_permutexvar_epi16(scale_idx1, words);
  out.offset = _mm512_mullo_epi16(words, _mm512_set1_epi16(-32));
  out.d = _mm512_set1_ps(avx512::half_to_float(x.d));
}

void dot_q6_tile(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride, int n_act, float* out, int64_t out_stride) {
  const int64_t nb = n / k_qk_k;
  const auto* wb = static_cast<const uint8_t*>(w);
  const auto* ab = static_cast<const uint8_t*>(act);
  avx512::with_tile(n_w, n_act, [&]<int NW, int NR>() {
    const block_q6_k* x[NW];
    const block_q8_k* y[NR];
    for (int o = 0; o < NW; ++o) x[o] = reinterpret_cast<const block_q6_k*>(wb + o * w_stride);
    for (int r = 0; r < NR; ++r) y[r] = reinterpret_cast<const block_q8_k*>(ab + r * act_stride);
    const __m512i scale_idx0 = load_index(k_q6_scale0);
    const __m512i scale_idx1 = load_index(k_q6_scale1);
    __m512 acc[NW][NR];
#pragma GCC unroll 4
    for (int o = 0; o < NW; ++o)
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) acc[o][r] = _mm512_setzero_ps();
    prefetch_cursor<block_q6_k> ahead(nb, NW * w_stride);
    for (int64_t b = 0; b < nb; ++b, ahead.advance()) {
      for (int o = 0; o < NW; ++o) ahead.fetch(x[o]);
#pragma GCC unroll 4
      for (int o = 0; o < NW; ++o) {
        q6_block xb;
        decode_q6(x[o][b], xb, scale_idx0, scale_idx1);
#pragma GCC unroll 4
        for (int r = 0; r < NR; ++r) {
          __m512i s = scaled_sum(xb.c, y[r][b].qs);
          s = _mm512_dpwssd_epi32(s, _mm512_maskz_loadu_epi64(0x0F, y[r][b].bsums), xb.offset);
          acc[o][r] = _mm512_fmadd_ps(to_float(s), _mm512_mul_ps(xb.d, _mm512_set1_ps(y[r][b].d)), acc[o][r]);
        }
      }
    }
#pragma GCC unroll 4
    for (int o = 0; o < NW; ++o)
#pragma GCC unroll 4
      for (int r = 0; r < NR; ++r) out[r * out_stride + o] = sum_lanes(acc[o][r]);
  });
}

}  // namespace

void dot_q4_k_avx512(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride, int n_act, float* out,
                     int64_t out_stride) {
  dot_affine_tile<false, block_q4_k>(n, w, w_stride, n_w, act, act_stride, n_act, out, out_stride);
}

void dot_q5_k_avx512(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride, int n_act, float* out,
                     int64_t out_stride) {
  dot_affine_tile<true, block_q5_k>(n, w, w_stride, n_w, act, act_stride, n_act, out, out_stride);
}

void dot_q6_k_avx512(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride, int n_act, float* out,
                     int64_t out_stride) {
  dot_q6_tile(n, w, w_stride, n_w, act, act_stride, n_act, out, out_stride);
}

}  // namespace tandem::kernels::cpu
