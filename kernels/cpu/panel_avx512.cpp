// AVX-512 VNNI panel packing and the panel kernel (see panel.h for the format).
//
// Packing decodes each of the 16 rows into codes with byte shuffles, then turns 16 rows x 32
// codes into 8 registers of 16 dwords (one per row) with a 16x8 dword transpose: a dword
// permute pairs the rows' dwords into qwords, and two rounds of 128-bit shuffles after one of
// qword unpacks finish an 8x8 qword transpose.
//
// The kernel keeps one int32 and one float accumulator per activation row (up to 8 rows: 16
// of the 32 registers) and walks the sub-blocks: per 4 columns, one code register is loaded
// and each row's 4 activation bytes are a broadcast memory operand of vpdpbusd; per
// sub-block, each row's integer sums are converted once and scaled by the 16 row scales.
#include <immintrin.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/blocks.h"
#include "kernels/cpu/panel.h"
#include "kernels/cpu/panel_avx512.h"
#include "kernels/cpu/simd_avx512.h"

namespace tandem::kernels::cpu {
namespace {

using avx512::half_to_float;

// Masked forms with all lanes set: GCC 12 reports false -Wmaybe-uninitialized warnings from
// the unmasked intrinsics (see simd_avx512.h).
constexpr __mmask16 k_all16 = 0xFFFF;
constexpr __mmask8 k_all8 = 0xFF;

static inline __m128i load16(const void* p) { return _mm_loadu_si128(static_cast<const __m128i*>(p)); }
static inline void store16(void* p, __m128i v) { _mm_storeu_si128(static_cast<__m128i*>(p), v); }
static inline void store32(void* p, __m256i v) { _mm256_storeu_si256(static_cast<__m256i*>(p), v); }
static inline __m256i nib_mask() { return _mm256_set1_epi8(0x0F); }

// Codes of columns [k, k + 32) of one weight row (k a multiple of 32), in column order.
static inline __m256i nibbles32(const uint8_t* qs) {
  const __m128i x = load16(qs), m = _mm_set1_epi8(0x0F);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(x, 4), m), _mm_and_si128(x, m));
}
static inline __m256i with_fifth_bits(__m256i c, const uint8_t* qh) {
  uint32_t bits;
  std::memcpy(&bits, qh, 4);
  return _mm256_or_si256(c, _mm256_maskz_set1_epi8(bits, 0x10));
}

template <weight_type WT>
static inline __m256i codes32(const uint8_t* row, int64_t k) {
  if constexpr (WT == weight_type::q4_0) {
    return nibbles32(row + (k / 32) * sizeof(block_q4_0) + 2);
  } else if constexpr (WT == weight_type::q4_1) {
    return nibbles32(row + (k / 32) * sizeof(block_q4_1) + 4);
  } else if constexpr (WT == weight_type::q5_0) {
    const uint8_t* b = row + (k / 32) * sizeof(block_q5_0);
    return with_fifth_bits(nibbles32(b + 6), b + 2);
  } else if constexpr (WT == weight_type::q5_1) {
    const uint8_t* b = row + (k / 32) * sizeof(block_q5_1);
    return with_fifth_bits(nibbles32(b + 8), b + 4);
  } else if constexpr (WT == weight_type::q8_0) {
    return _mm256_xor_si256(avx512::load32(row + (k / 32) * sizeof(block_q8_0) + 2), _mm256_set1_epi8(static_cast<char>(0x80)));
  } else if constexpr (WT == weight_type::q4_k || WT == weight_type::q5_k) {
    constexpr bool five = WT == weight_type::q5_k;
    const auto* b = reinterpret_cast<const block_q4_k*>(row + (k / 256) * (five ? sizeof(block_q5_k) : sizeof(block_q4_k)));
    const auto* b5 = reinterpret_cast<const block_q5_k*>(b);
    const int c = static_cast<int>(k % 256) / 64, high = static_cast<int>(k % 64) / 32;
    const __m256i x = avx512::load32((five ? b5->qs : b->qs) + 32 * c);
    __m256i q = _mm256_and_si256(high ? _mm256_srli_epi16(x, 4) : x, nib_mask());
    if constexpr (five) {
      const __mmask32 bit = _mm256_test_epi8_mask(avx512::load32(b5->qh), _mm256_set1_epi8(static_cast<char>(1 << (2 * c + high))));
      q = _mm256_or_si256(q, _mm256_maskz_set1_epi8(bit, 0x10));
    }
    return q;
  } else {
    static_assert(WT == weight_type::q6_k);
    const auto* b = reinterpret_cast<const block_q6_k*>(row + (k / 256) * sizeof(block_q6_k));
    const int h = static_cast<int>(k % 256) / 128, part = static_cast<int>(k % 128) / 32;
    const __m256i lo = avx512::load32(b->ql + 64 * h + 32 * (part & 1));
    const __m256i hb = avx512::load32(b->qh + 32 * h);
    const __m256i m30 = _mm256_set1_epi8(0x30);
    const __m256i low4 = _mm256_and_si256(part < 2 ? lo : _mm256_srli_epi16(lo, 4), nib_mask());
    // Bits 2*part, 2*part + 1 of qh become bits 4, 5 of the code.
    __m256i high2;
    switch (part) {
      case 0:
        high2 = _mm256_slli_epi16(hb, 4);
        break;
      case 1:
        high2 = _mm256_slli_epi16(hb, 2);
        break;
      case 2:
        high2 = hb;
        break;
      default:
        high2 = _mm256_srli_epi16(hb, 2);
        break;
    }
    return _mm256_or_si256(low4, _mm256_and_si256(high2, m30));
  }
}

template <weight_type WT>
constexpr size_t row_scale_block_bytes() {
  return WT == weight_type::q4_0   ? sizeof(block_q4_0)
         : WT == weight_type::q4_1 ? sizeof(block_q4_1)
         : WT == weight_type::q5_0 ? sizeof(block_q5_0)
         : WT == weight_type::q5_1 ? sizeof(block_q5_1)
                                   : sizeof(block_q8_0);
}

// out[g] dword r = dword g of rows[r] (32 bytes each), g < 8, r < 16.
static inline void transpose_16x8(const uint8_t* const* rows, __m512i out[8]) {
  const __m512i pair = _mm512_set_epi32(15, 7, 14, 6, 13, 5, 12, 4, 11, 3, 10, 2, 9, 1, 8, 0);
  __m512i z[8];
  for (int i = 0; i < 8; ++i)
    z[i] = _mm512_maskz_permutexvar_epi32(k_all16, pair, avx512::join(avx512::load32(rows[2 * i]), avx512::load32(rows[2 * i + 1])));
  // z[i] qword g = (row 2i, row 2i+1) dwords g; now out[g] qword i = z[i] qword g.
  __m512i t[8];
  for (int i = 0; i < 8; i += 2) {
    t[i] = _mm512_maskz_unpacklo_epi64(k_all8, z[i], z[i + 1]);      // qwords 0,2,4,6 of z[i], z[i+1] interleaved
    t[i + 1] = _mm512_maskz_unpackhi_epi64(k_all8, z[i], z[i + 1]);  // qwords 1,3,5,7
  }
  const __m512i u0 = _mm512_maskz_shuffle_i64x2(k_all8, t[0], t[2], _MM_SHUFFLE(2, 0, 2, 0));  // q0 / q4 of z0..z3
  const __m512i u1 = _mm512_maskz_shuffle_i64x2(k_all8, t[0], t[2], _MM_SHUFFLE(3, 1, 3, 1));  // q2 / q6
  const __m512i u2 = _mm512_maskz_shuffle_i64x2(k_all8, t[4], t[6], _MM_SHUFFLE(2, 0, 2, 0));  // q0 / q4 of z4..z7
  const __m512i u3 = _mm512_maskz_shuffle_i64x2(k_all8, t[4], t[6], _MM_SHUFFLE(3, 1, 3, 1));
  const __m512i v0 = _mm512_maskz_shuffle_i64x2(k_all8, t[1], t[3], _MM_SHUFFLE(2, 0, 2, 0));  // q1 / q5
  const __m512i v1 = _mm512_maskz_shuffle_i64x2(k_all8, t[1], t[3], _MM_SHUFFLE(3, 1, 3, 1));  // q3 / q7
  const __m512i v2 = _mm512_maskz_shuffle_i64x2(k_all8, t[5], t[7], _MM_SHUFFLE(2, 0, 2, 0));
  const __m512i v3 = _mm512_maskz_shuffle_i64x2(k_all8, t[5], t[7], _MM_SHUFFLE(3, 1, 3, 1));
  out[0] = _mm512_maskz_shuffle_i64x2(k_all8, u0, u2, _MM_SHUFFLE(2, 0, 2, 0));
  out[4] = _mm512_maskz_shuffle_i64x2(k_all8, u0, u2, _MM_SHUFFLE(3, 1, 3, 1));
  out[2] = _mm512_maskz_shuffle_i64x2(k_all8, u1, u3, _MM_SHUFFLE(2, 0, 2, 0));
  out[6] = _mm512_maskz_shuffle_i64x2(k_all8, u1, u3, _MM_SHUFFLE(3, 1, 3, 1));
  out[1] = _mm512_maskz_shuffle_i64x2(k_all8, v0, v2, _MM_SHUFFLE(2, 0, 2, 0));
  out[5] = _mm512_maskz_shuffle_i64x2(k_all8, v0, v2, _MM_SHUFFLE(3, 1, 3, 1));
  out[3] = _mm512_maskz_shuffle_i64x2(k_all8, v1, v3, _MM_SHUFFLE(2, 0, 2, 0));
  out[7] = _mm512_maskz_shuffle_i64x2(k_all8, v1, v3, _MM_SHUFFLE(3, 1, 3, 1));
}

// R activation rows against one panel of sub-blocks of S elements. Offset: the type's codes
// carry an offset (panel_code_offset), so each integer sum starts from the activations'
// offset term and the mins are not read.
template <int S, int R, bool Offset>
void panel_tile(const uint8_t* panel, int64_t cols, const int8_t* codes, const float* aux, float* out, int64_t out_stride, __mmask16 lanes) {
  constexpr int groups = S / 4;
  constexpr size_t sub_bytes = groups * 64 + 2 * 64;
  const int64_t nsub = cols / S;
  __m512 f[R];
  TANDEM_UNROLL for (int r = 0; r < R; ++r) f[r] = _mm512_setzero_ps();
  for (int64_t s = 0; s < nsub; ++s) {
    const uint8_t* p = panel + s * sub_bytes;
    const int8_t* q = codes + s * S;
    // Two integer sums per row, even and odd groups, added before the conversion: one chain
    // of all the groups is 8 vpdpbusd latencies long per sub-block, longer than the pass
    // over all rows takes at two per cycle, so the core would wait on it (see packed_tile).
    __m512i acc[R], acc_odd[R];
    TANDEM_UNROLL for (int r = 0; r < R; ++r) {
      if constexpr (Offset) {
        acc[r] = _mm512_set1_epi32(panel_offset_term(aux + (r * nsub + s) * k_panel_aux_per_sub));
      } else {
        acc[r] = _mm512_setzero_si512();
      }
      acc_odd[r] = _mm512_setzero_si512();
    }
    TANDEM_UNROLL for (int g = 0; g < groups; ++g) {
      const __m512i c = _mm512_load_si512(p + 64 * g);
      TANDEM_UNROLL for (int r = 0; r < R; ++r) {
        __m512i& sum = g % 2 == 0 ? acc[r] : acc_odd[r];
        sum = avx512::dpbusd_bcast(sum, c, q + r * cols + 4 * g);
      }
    }
    const __m512 sc = _mm512_load_ps(p + groups * 64), mn = _mm512_load_ps(p + groups * 64 + 64);
    TANDEM_UNROLL for (int r = 0; r < R; ++r) {
      const float* x = aux + (r * nsub + s) * k_panel_aux_per_sub;
      const __m512 t = _mm512_maskz_cvtepi32_ps(k_all16, _mm512_add_epi32(acc[r], acc_odd[r]));
      f[r] = _mm512_fmadd_ps(t, _mm512_mul_ps(sc, _mm512_set1_ps(x[0])), f[r]);
      if constexpr (!Offset) f[r] = _mm512_fmadd_ps(mn, _mm512_set1_ps(x[1]), f[r]);
    }
  }
  TANDEM_UNROLL for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(out + r * out_stride, lanes, f[r]);
}

}  // namespace

namespace {

// Writes the panel of n_rows rows (the rest zero): codes by 32-column chunks straight from the
// blocks into the transpose, then scales and mins row by row into their lanes.
template <weight_type WT>
void pack(const uint8_t* w, size_t w_row, int n_rows, int64_t cols, uint8_t* panel) {
  constexpr int sub = WT == weight_type::q6_k ? 16 : 32;
  constexpr size_t sub_bytes = sub / 4 * 64 + 128;
  const int64_t nsub = cols / sub;
  alignas(32) static const uint8_t zeros[32] = {};
  alignas(32) uint8_t chunk[k_panel_rows][32];
  const uint8_t* rows[k_panel_rows];
  for (int r = 0; r < k_panel_rows; ++r) rows[r] = r < n_rows ? chunk[r] : zeros;
  const size_t slice = (k_panel_rows * w_row / static_cast<size_t>(cols / 32) + 63) / 64 * 64;
  for (int64_t k = 0; k < cols; k += 32) {
    // A panel's rows are one contiguous run of memory, and matmul packs the next run right
    // after: while this one is decoded, ask for the next in equal slices per chunk. Without
    // it packing waits on memory at each panel's first touches (measured: over a third of
    // its time on the loads).
    for (size_t b = static_cast<size_t>(k / 32) * slice; b < static_cast<size_t>(k / 32 + 1) * slice; b += 64)
      avx512::prefetch(w, k_panel_rows * w_row + b);  // an integer address: may lie past the matrix
    for (int r = 0; r < n_rows; ++r) _mm256_store_si256(reinterpret_cast<__m256i*>(chunk[r]), codes32<WT>(w + r * w_row, k));
    __m512i g[8];
    transpose_16x8(rows, g);
    for (int i = 0; i < 8; ++i) {
      const int64_t e = k + 4 * i;  // first column of group i
      _mm512_store_si512(panel + (e / sub) * sub_bytes + (e % sub) / 4 * 64, g[i]);
    }
  }
  if constexpr (sub == 32 && WT != weight_type::q4_k && WT != weight_type::q5_k) {
    // 32-element blocks: one gather fetches the 16 rows' fp16 scale (and Q4_1/Q5_1 offset)
    // of a block, from lines the codes just brought in.
    constexpr int bytes = static_cast<int>(row_scale_block_bytes<WT>());
    constexpr bool has_min = WT == weight_type::q4_1 || WT == weight_type::q5_1;
    constexpr float offset = WT == weight_type::q4_0 ? -8.0f : WT == weight_type::q5_0 ? -16.0f : -128.0f;
    const __mmask16 live = avx512::first16(n_rows);
    const __m512i rows_at =
        _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(static_cast<int>(w_row)));
    for (int64_t i = 0; i < nsub; ++i) {
      const __m512i dm = _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, rows_at, w + i * bytes, 1);
      const __m512 d = avx512::cvt_f16(_mm512_maskz_cvtepi32_epi16(k_all16, dm));
      float* f = reinterpret_cast<float*>(panel + i * sub_bytes + sub / 4 * 64);
      _mm512_store_ps(f, d);
      if constexpr (has_min)
        _mm512_store_ps(f + k_panel_rows, avx512::cvt_f16(_mm512_maskz_cvtepi32_epi16(k_all16, _mm512_maskz_srli_epi32(k_all16, dm, 16))));
      else
        _mm512_store_ps(f + k_panel_rows, _mm512_maskz_mul_ps(live, d, _mm512_set1_ps(offset)));  // +0 in missing rows, as the reference
    }
  } else {
    // K-quants: per super-block, gathers fetch the 16 rows' d (and dmin) and packed scales;
    // the scales are unpacked lane-wise with the formulas of unpack_k_scale.
    const __mmask16 live = avx512::first16(n_rows);
    const __m512i rows_at =
        _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), _mm512_set1_epi32(static_cast<int>(w_row)));
    auto gather = [&](const uint8_t* at) { return _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live, rows_at, at, 1); };
    auto lanes_f16 = [](__m512i v) { return avx512::cvt_f16(_mm512_maskz_cvtepi32_epi16(k_all16, v)); };
    auto byte_of = [](__m512i v, int b) {  // byte b (0..3) of each dword, zero-extended
      return _mm512_maskz_and_epi32(k_all16, _mm512_maskz_srlv_epi32(k_all16, v, _mm512_set1_epi32(8 * b)), _mm512_set1_epi32(0xFF));
    };
    auto store = [&](int64_t sb, __m512 scale, __m512 min) {
      float* f = reinterpret_cast<float*>(panel + sb * sub_bytes + sub / 4 * 64);
      _mm512_store_ps(f, scale);
      _mm512_store_ps(f + k_panel_rows, min);
    };
    for (int64_t i = 0; i < cols / 256; ++i) {
      if constexpr (WT == weight_type::q6_k) {
        const uint8_t* b = w + i * sizeof(block_q6_k);
        // d is the block's last 2 bytes: gather the dword that ends with it (a dword starting
        // at d would read 2 bytes past the block, past the matrix for the last row).
        const __m512 d = lanes_f16(_mm512_maskz_srli_epi32(k_all16, gather(b + offsetof(block_q6_k, d) - 2), 16));
        for (int k = 0; k < 4; ++k) {
          const __m512i four = gather(b + offsetof(block_q6_k, scales) + 4 * k);  // scales 4k..4k+3
          for (int j = 0; j < 4; ++j) {
            // Signed byte j: shift it to the top, then arithmetic shift back down.
            const __m512i sc = _mm512_maskz_srai_epi32(k_all16, _mm512_maskz_sllv_epi32(k_all16, four, _mm512_set1_epi32(24 - 8 * j)), 24);
            const __m512 scale = _mm512_mul_ps(d, _mm512_maskz_cvtepi32_ps(k_all16, sc));
            store(16 * i + 4 * k + j, scale, _mm512_maskz_mul_ps(live, scale, _mm512_set1_ps(-32.0f)));
          }
        }
      } else {
        const uint8_t* b = w + i * (WT == weight_type::q4_k ? sizeof(block_q4_k) : sizeof(block_q5_k));
        const __m512i dd = gather(b);  // d | dmin << 16
        const __m512 d = lanes_f16(dd), dmin = lanes_f16(_mm512_maskz_srli_epi32(k_all16, dd, 16));
        const __m512i s0 = gather(b + 4), s1 = gather(b + 8), s2 = gather(b + 12);  // scales[0..11]
        const __m512i m63 = _mm512_set1_epi32(63), m15 = _mm512_set1_epi32(15);
        for (int j = 0; j < 8; ++j) {
          __m512i sc, m;
          if (j < 4) {
            sc = _mm512_maskz_and_epi32(k_all16, byte_of(s0, j), m63);
            m = _mm512_maskz_and_epi32(k_all16, byte_of(s1, j), m63);
          } else {
            const __m512i hi = byte_of(s2, j - 4);
            sc = _mm512_maskz_or_epi32(k_all16, _mm512_maskz_and_epi32(k_all16, hi, m15),
                                       _mm512_maskz_slli_epi32(k_all16, _mm512_maskz_srli_epi32(k_all16, byte_of(s0, j - 4), 6), 4));
            m = _mm512_maskz_or_epi32(k_all16, _mm512_maskz_srli_epi32(k_all16, hi, 4),
                                      _mm512_maskz_slli_epi32(k_all16, _mm512_maskz_srli_epi32(k_all16, byte_of(s1, j - 4), 6), 4));
          }
          const __m512 scale = _mm512_mul_ps(d, _mm512_maskz_cvtepi32_ps(k_all16, sc));
          // (-dmin) * m as the reference computes it (sign of zero included); 0 in missing rows.
          const __m512 min = _mm512_maskz_mul_ps(live, _mm512_xor_ps(dmin, _mm512_set1_ps(-0.0f)), _mm512_maskz_cvtepi32_ps(k_all16, m));
          store(8 * i + j, scale, min);
        }
      }
    }
  }
}

}  // namespace

void pack_panel_avx512(weight_type wt, const void* w, size_t w_row, int n_rows, int64_t cols, uint8_t* panel) {
  const auto* wb = static_cast<const uint8_t*>(w);
  switch (wt) {
    case weight_type::q4_0:
      return pack<weight_type::q4_0>(wb, w_row, n_rows, cols, panel);
    case weight_type::q4_1:
      return pack<weight_type::q4_1>(wb, w_row, n_rows, cols, panel);
    case weight_type::q5_0:
      return pack<weight_type::q5_0>(wb, w_row, n_rows, cols, panel);
    case weight_type::q5_1:
      return pack<weight_type::q5_1>(wb, w_row, n_rows, cols, panel);
    case weight_type::q8_0:
      return pack<weight_type::q8_0>(wb, w_row, n_rows, cols, panel);
    case weight_type::q4_k:
      return pack<weight_type::q4_k>(wb, w_row, n_rows, cols, panel);
    case weight_type::q5_k:
      return pack<weight_type::q5_k>(wb, w_row, n_rows, cols, panel);
    case weight_type::q6_k:
      return pack<weight_type::q6_k>(wb, w_row, n_rows, cols, panel);
    default:
      throw std::invalid_argument("panel: no panel form for " + display_name(wt) + " weights");
  }
}

void panel_dot_avx512(weight_type wt, const uint8_t* panel, int64_t cols, const int8_t* codes, const float* aux, int n_act, float* out,
                      int64_t out_stride, int n_w) {
  const __mmask16 lanes = avx512::first16(n_w);
  if (wt == weight_type::q4_1 || wt == weight_type::q5_1) {
    constexpr size_t sub_bytes = 8 * 64 + 2 * 64;
    avx512::ggml_order_rows(
        cols / 32, codes, cols, aux, n_act, out, out_stride, lanes,
        [&](int64_t b, int g) { return _mm512_load_si512(panel + b * sub_bytes + 64 * g); },
        [&](int64_t b, __m512& d, __m512& m) {
          d = _mm512_load_ps(panel + b * sub_bytes + 8 * 64);
          m = _mm512_load_ps(panel + b * sub_bytes + 8 * 64 + 64);
        });
    return;
  }
  const bool offset = panel_code_offset(wt) != 0;
  avx512::with_act_rows(n_act, [&]<int R>() {
    if (panel_sub_elems(wt) == 16) {
      if (offset)
        panel_tile<16, R, true>(panel, cols, codes, aux, out, out_stride, lanes);
      else
        panel_tile<16, R, false>(panel, cols, codes, aux, out, out_stride, lanes);
    } else {
      if (offset)
        panel_tile<32, R, true>(panel, cols, codes, aux, out, out_stride, lanes);
      else
        panel_tile<32, R, false>(panel, cols, codes, aux, out, out_stride, lanes);
    }
  });
}

}  // namespace tandem::kernels::cpu
