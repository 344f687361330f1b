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
#include <immintrin.h>

#include <array>

#include "kernels/cpu/simd_avx512.h"
#include "kernels/cpu/vec_dot.h"

namespace tandem::kernels::cpu {
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
static inline __m512i qword_srli(__m512i v) { return _mm512_maskz_srli_epi64(k_all8, v, n); }
template <unsigned n>
static inline __m512i qword_slli(__m512i v) { return _mm512_maskz_slli_epi64(k_all8, v, n); }

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
      : nb_(nb),
        tile_bytes_(tile_bytes),
        tiles_(nb > 0 ? k_prefetch_blocks / nb : 0),
        block_(nb > 0 ? k_prefetch_blocks % nb : 0) {}

  // Prefetches the block ahead of the current one in `row`.
  void fetch(const Block* row) const {
    const uintptr_t p = reinterpret_cast<uintptr_t>(row) + static_cast<uintptr_t>(tiles_) * tile_bytes_ +
                        static_cast<uintptr_t>(block_) * sizeof(Block);
    for (size_t off = 0; off < sizeof(Block); off += 64)
      _mm_prefetch(reinterpret_cast<const char*>(p + off), _MM_HINT_T0);
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
  const __m256 s8 =
      _mm256_add_ps(_mm512_maskz_extractf32x8_ps(k_all8, v, 0), _mm512_maskz_extractf32x8_ps(k_all8, v, 1));
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
  const __m128i low =
      _mm_and_si128(_mm_srlv_epi32(_mm_shuffle_epi32(raw, _MM_SHUFFLE(2, 1, 2, 0)), _mm_setr_epi32(0, 0, 0, 4)),
                    _mm_setr_epi32(0x3F3F3F3F, 0x0F0F0F0F, 0x3F3F3F3F, 0x0F0F0F0F));
  // Bits 6-7 of bytes 0-3 (4-7) become bits 4-5 of sc4-7 (m4-7); the mask drops what the
  // dword shift pulls in from the neighbouring byte.
  const __m128i top = _mm_and_si128(_mm_srli_epi32(_mm_shuffle_epi32(raw, _MM_SHUFFLE(1, 0, 0, 0)), 2),
                                    _mm_setr_epi32(0, 0x30303030, 0, 0x30303030));
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
static inline void decode_affine(const Block& x, affine_block& out, __m512i scale_idx0, __m512i scale_idx1,
                                 __m512i min_idx) {
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
      const __m512i top = _mm512_and_si512(qword_rolv(qh, _mm512_setr_epi64(lo, lo, lo, lo, hi, hi, hi, hi)),
                                           _mm512_set1_epi8(0x10));
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
void dot_affine_tile(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride,
                     int n_act, float* out, int64_t out_stride) {
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
          const __m512i both = _mm512_mask_add_epi32(_mm512_madd_epi16(neg_bsums[r], xb.mins), 0x5555, s,
                                                     qword_srli<32>(s));
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

void dot_q6_tile(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride, int n_act,
                 float* out, int64_t out_stride) {
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
          acc[o][r] = _mm512_fmadd_ps(to_float(s), _mm512_mul_ps(xb.d, _mm512_set1_ps(y[r][b].d)),
                                      acc[o][r]);
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

void dot_q4_k_avx512(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride,
                     int n_act, float* out, int64_t out_stride) {
  dot_affine_tile<false, block_q4_k>(n, w, w_stride, n_w, act, act_stride, n_act, out, out_stride);
}

void dot_q5_k_avx512(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride,
                     int n_act, float* out, int64_t out_stride) {
  dot_affine_tile<true, block_q5_k>(n, w, w_stride, n_w, act, act_stride, n_act, out, out_stride);
}

void dot_q6_k_avx512(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride,
                     int n_act, float* out, int64_t out_stride) {
  dot_q6_tile(n, w, w_stride, n_w, act, act_stride, n_act, out, out_stride);
}

}  // namespace tandem::kernels::cpu
