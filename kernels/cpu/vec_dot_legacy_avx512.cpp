// AVX-512 VNNI dots for the 32-element blocks, as tiles of NW weight rows x NR activation
// rows.
//
// Layout: a step takes a quad of four consecutive blocks and holds its codes in two zmm:
// `lo` has elements 0..15 of block k in bytes 16k..16k+15 and `hi` elements 16..31. One
// two-table word permute (vpermt2w) brings 16-byte segments of four blocks into that
// layout; for Q4 / Q5 the segment is the block's 16 packed bytes, whose low nibbles are
// elements 0..15 and high nibbles elements 16..31, so lo and hi are just masks and a shift
// of one permuted register.
//
// Integer part: every weight code enters vpdpbusd as an unsigned byte: Q4 / Q5 codes as
// stored, Q8_0 codes with the sign bit flipped (w + 128). What that offset adds (8, 16 or
// 128 times the activation codes) depends only on the activation block, so it is computed
// once per activation row and quad and seeds the dpbusd of every weight row. Int32 lanes
// 4k..4k+3 then hold exact partial sums (eight products each) of block k's integer.
//
// Float part: the fp16 scales come out of the same two tables as the codes, one more
// permute placing block k's d over its int32 lanes 4k..4k+3; one FMA per quad then adds
// sum * dx * dy, so results differ from the scalar kernel only in the order of float
// additions.
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/simd_avx512.h"
#include "kernels/cpu/vec_dot.h"

namespace tandem::kernels::cpu {
namespace {

using namespace avx512;

constexpr int k_quad = 4;  // blocks per step

// Byte offsets, from the quad's first block, of the two 64-byte tables one vpermt2w picks
// from.
struct table_offsets {
  int a, b;
};

// Tables for the 16-byte segments at byte `seg` of four blocks of `bs` bytes; table b ends
// with block 3's segment. With `heads`, table a starts at block 0 so that it also holds the
// blocks' first four bytes (d, and m or s), else at block 0's segment.
constexpr table_offsets tables_for(int bs, int seg, bool heads) { return {heads ? 0 : seg, 3 * bs + seg + 16 - 64}; }

// Word index of byte x (even) of the quad in the tables, or -1 where neither holds it.
constexpr int table_word(table_offsets t, int x) {
  if (x >= t.a && x + 2 <= t.a + 64) return (x - t.a) / 2;
  if (x >= t.b && x + 2 <= t.b + 64) return 32 + (x - t.b) / 2;
  return -1;
}

// Word i of 128-bit lane k = word i of block k's segment.
constexpr word_index segment_index(table_offsets t, int bs, int seg) {
  word_index x{};
  for (int k = 0; k < k_quad; ++k)
    for (int i = 0; i < 8; ++i) x.w[8 * k + i] = static_cast<uint16_t>(table_word(t, k * bs + seg + 2 * i));
  return x;
}

// Words 4k..4k+3: block k's fp16 d (its first two bytes), so converted they spread over the
// int32 lanes of block k; word 16 + k: the fp16 after it (m, or Q8_1's s). Other high words
// are zeroed by k_head_words.
constexpr word_index heads_index(table_offsets t, int bs) {
  word_index x{};
  for (int k = 0; k < k_quad; ++k) {
    for (int i = 0; i < 4; ++i) x.w[4 * k + i] = static_cast<uint16_t>(table_word(t, k * bs));
    x.w[16 + k] = static_cast<uint16_t>(table_word(t, k * bs + 2));
  }
  return x;
}
constexpr __mmask32 k_head_words = 0x000FFFFF;

constexpr bool indices_valid(const word_index& x) {
  for (const uint16_t w : x.w)
    if (w >= 64) return false;
  return true;
}

struct tables {
  __m512i a, b;
};

// The two tables of a quad at p. Partial: only the first `count` blocks are read, the rest
// of the tables is zero.
template <int Bs, table_offsets T, bool Partial>
tables load_tables(const uint8_t* p, int count) {
  static_assert(T.a >= 0 && T.b >= T.a && T.b + 64 <= k_quad * Bs, "tables must lie inside the quad");
  if constexpr (Partial) return {load_bytes(p + T.a, count * Bs - T.a), load_bytes(p + T.b, count * Bs - T.b)};
  else return {load64(p + T.a), load64(p + T.b)};
}

__m512i pick(const tables& t, const word_index& idx) { return _mm512_permutex2var_epi16(t.a, idx.load(), t.b); }

// One quad of weights or activations: codes in the quad layout, the fp16 d of each block
// spread over its int32 lanes as float, and (types with an offset; Q8_1) the second fp16
// of block k in lane k.
struct quad {
  __m512i lo, hi;
  __m512 d, m;
};

template <bool Second>
void unpack_heads(const tables& t, const word_index& idx, quad& q) {
  const __m512i h = _mm512_maskz_permutex2var_epi16(k_head_words, t.a, idx.load(), t.b);
  q.d = halves_lo(h);
  q.m = Second ? halves_hi(h) : _mm512_setzero_ps();
}

// Q8_0 / Q8_1 blocks (activations, and Q8_0 weights): 32 code bytes after the heads.
template <class Block, bool Second, bool Partial>
quad load_q8(const uint8_t* p, int count) {
  constexpr int bs = sizeof(Block), seg = offsetof(Block, qs);
  constexpr table_offsets tlo = tables_for(bs, seg, true), thi = tables_for(bs, seg + 16, false);
  static constexpr word_index lo = segment_index(tlo, bs, seg), hi = segment_index(thi, bs, seg + 16),
                              heads = heads_index(tlo, bs);
  static_assert(indices_valid(lo) && indices_valid(hi) && indices_valid(heads));
  const tables a = load_tables<bs, tlo, Partial>(p, count);
  quad q;
  q.lo = pick(a, lo);
  q.hi = pick(load_tables<bs, thi, Partial>(p, count), hi);
  unpack_heads<Second>(a, heads, q);
  return q;
}

// Q4 / Q5 blocks: the 16 packed bytes of a block, low nibbles elements 0..15 and high
// nibbles 16..31, come out of one permute into lo and hi by masks and a shift.
template <class Block, bool Second, bool Partial>
quad load_nibbles(const uint8_t* p, int count) {
  constexpr int bs = sizeof(Block), seg = offsetof(Block, qs);
  constexpr table_offsets t = tables_for(bs, seg, true);
  static constexpr word_index packed = segment_index(t, bs, seg), heads = heads_index(t, bs);
  static_assert(indices_valid(packed) && indices_valid(heads));
  const tables a = load_tables<bs, t, Partial>(p, count);
  const __m512i both = pick(a, packed);
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  quad q;
  q.lo = _mm512_and_si512(both, low4);
  q.hi = _mm512_and_si512(_mm512_srli_epi16(both, 4), low4);
  unpack_heads<Second>(a, heads, q);
  return q;
}

// Q5: the nibbles plus 16 where the fifth bit is set. Bit j of a block's qh is element j,
// which sits at byte 16k + j of lo (j < 16) or 16k + j - 16 of hi.
template <class Block, bool Second, bool Partial>
quad load_q5(const uint8_t* p, int count) {
  quad q = load_nibbles<Block, Second, Partial>(p, count);
  uint64_t lo = 0, hi = 0;
  for (int k = 0; k < (Partial ? count : k_quad); ++k) {
    uint32_t h;
    std::memcpy(&h, p + k * sizeof(Block) + offsetof(Block, qh), sizeof h);
    lo |= static_cast<uint64_t>(h & 0xFFFF) << (16 * k);
    hi |= static_cast<uint64_t>(h >> 16) << (16 * k);
  }
  const __m512i sixteen = _mm512_set1_epi8(16);
  q.lo = _mm512_mask_add_epi8(q.lo, _cvtu64_mask64(lo), q.lo, sixteen);
  q.hi = _mm512_mask_add_epi8(q.hi, _cvtu64_mask64(hi), q.hi, sixteen);
  return q;
}

// Per weight type: the block, the activation block it meets, whether it carries an offset m
// (then the activation is Q8_1 and each block adds m * s), the byte whose dpbusd with the
// activation codes is the offset to take back (types without m), and a quad of weights
// with the codes as unsigned bytes.
struct q4_0_traits {
  using block = block_q4_0;
  using act_block = block_q8_0;
  static constexpr bool has_min = false;
  static constexpr char offset = 8;
  template <bool Partial>
  static quad load(const uint8_t* p, int count) { return load_nibbles<block, false, Partial>(p, count); }
};

struct q4_1_traits {
  using block = block_q4_1;
  using act_block = block_q8_1;
  static constexpr bool has_min = true;
  static constexpr char offset = 0;
  template <bool Partial>
  static quad load(const uint8_t* p, int count) { return load_nibbles<block, true, Partial>(p, count); }
};

struct q5_0_traits {
  using block = block_q5_0;
  using act_block = block_q8_0;
  static constexpr bool has_min = false;
  static constexpr char offset = 16;
  template <bool Partial>
  static quad load(const uint8_t* p, int count) { return load_q5<block, false, Partial>(p, count); }
};

struct q5_1_traits {
  using block = block_q5_1;
  using act_block = block_q8_1;
  static constexpr bool has_min = true;
  static constexpr char offset = 0;
  template <bool Partial>
  static quad load(const uint8_t* p, int count) { return load_q5<block, true, Partial>(p, count); }
};

struct q8_0_traits {
  using block = block_q8_0;
  using act_block = block_q8_0;
  static constexpr bool has_min = false;
  static constexpr char offset = static_cast<char>(0x80);
  template <bool Partial>
  static quad load(const uint8_t* p, int count) {
    quad q = load_q8<block, false, Partial>(p, count);
    const __m512i flip = _mm512_set1_epi8(offset);
    q.lo = _mm512_xor_si512(q.lo, flip);
    q.hi = _mm512_xor_si512(q.hi, flip);
    return q;
  }
};

template <class T, int NW, int NR>
void tile(int64_t nb, const uint8_t* w, size_t w_stride, const uint8_t* act, size_t act_stride, float* out,
          int64_t out_stride) {
  constexpr int64_t wb = sizeof(typename T::block), ab = sizeof(typename T::act_block);
  __m512 acc[NW][NR];
  TANDEM_UNROLL
  for (int o = 0; o < NW; ++o)
    TANDEM_UNROLL
    for (int r = 0; r < NR; ++r) acc[o][r] = _mm512_setzero_ps();

  // One quad: the weight rows first, then each activation row against all of them (fewer
  // live registers than the other order).
  auto step = [&]<bool Partial>(int64_t b, int c) {
    quad x[NW];
    TANDEM_UNROLL
    for (int o = 0; o < NW; ++o) {
      const uint8_t* p = w + o * w_stride + b * wb;
      // The same bytes of the NW rows after the tile, which matmul reads next. The hardware
      // prefetchers lose track of the tile's interleaved row streams; without this, decode
      // reaches about half the memory bandwidth.
      for (int64_t i = 0; i < k_quad * wb; i += 64) prefetch(p, NW * w_stride + i);
      prefetch(p, NW * w_stride + k_quad * wb - 1);
      x[o] = T::template load<Partial>(p, c);
    }
    TANDEM_UNROLL
    for (int r = 0; r < NR; ++r) {
      const quad y = load_q8<typename T::act_block, T::has_min, Partial>(act + r * act_stride + b * ab, c);
      __m512i base = _mm512_setzero_si512();
      if constexpr (T::offset != 0) {
        const __m512i off = _mm512_set1_epi8(T::offset);
        base = _mm512_sub_epi32(base, _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(base, off, y.lo), off, y.hi));
      }
      TANDEM_UNROLL
      for (int o = 0; o < NW; ++o) {
        const __m512i sum = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(base, x[o].lo, y.lo), x[o].hi, y.hi);
        acc[o][r] = _mm512_fmadd_ps(cvt_i32(sum), _mm512_mul_ps(x[o].d, y.d), acc[o][r]);
        // m * s of the quad's blocks (lanes 0..3, zero elsewhere).
        if constexpr (T::has_min) acc[o][r] = _mm512_fmadd_ps(x[o].m, y.m, acc[o][r]);
      }
    }
  };
  int64_t b = 0;
  for (; b + k_quad <= nb; b += k_quad) step.template operator()<false>(b, k_quad);
  if (b < nb) step.template operator()<true>(b, static_cast<int>(nb - b));
  store_tile<NW, NR>(acc, out, out_stride);
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
