// The tile kernel over packed weights (packed.h), for packed_avx512.cpp. Include only from
// *_avx512.cpp files: everything is in an unnamed namespace, so each file compiles its own copy
// for its own instruction set.
//
// Per 32-column chunk the compact codes are widened to the 8 group registers of panel.h
// (nibble masks and shifts, Q6_K's high pairs moved into bits 4-5, the Q5 types' fifth bits
// added under a byte mask), each row's activation
// bytes meet them as vpdpbusd broadcasts, and per sub-block one conversion and a few FMAs apply
// the 16 rows' scales. The panel is one sequential stream; passes ask for every line
// k_packed_prefetch_ahead bytes ahead (the hardware prefetcher alone left them waiting on
// memory, measured), except where packed_avx512_requests says otherwise.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/packed.h"
#include "kernels/cpu/panel.h"
#include "kernels/cpu/panel_avx512.h"
#include "kernels/cpu/simd_avx512.h"

namespace tandem::kernels::cpu {
namespace {

using avx512::dpbusd_bcast;
using avx512::q6_high_pair;

constexpr int R16 = k_panel_rows;
constexpr __mmask16 k_all16 = 0xFFFF;
constexpr size_t k_prefetch_ahead = k_packed_prefetch_ahead;

// Makes p opaque to the optimiser (it can no longer relate it to other pointers), so the
// accesses at constant offsets from it keep one base register.
template <class T>
static inline void opaque(T*& p) {
  asm("" : "+r"(p));
}

// The int32 offset term of an activation sub-block (panel.h: the third aux float's bits).
static inline int32_t offset_term(const float* x) { return panel_offset_term(x); }

// -x, sign of zero included (0 - x would give +0 for x = +0, where the reference's -k * d
// gives -0).
static inline __m512 negate(__m512 x) { return _mm512_xor_ps(x, _mm512_set1_ps(-0.0f)); }
static inline __m512 f16x16(const uint8_t* p) { return avx512::cvt_f16(avx512::load32(p)); }
static inline __m512 u8x16(const uint8_t* p) {
  return _mm512_maskz_cvtepi32_ps(k_all16, _mm512_maskz_cvtepu8_epi32(k_all16, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}
static inline __m512 i8x16(const uint8_t* p) {
  return _mm512_maskz_cvtepi32_ps(k_all16, _mm512_maskz_cvtepi8_epi32(k_all16, _mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// Bit 4 of the codes of group g of a chunk whose fifth-bit masks start at `fifth` (Q5 types:
// 8 masks of 64 bits, bit 4r + e of mask g for row r, column 4g + e) set in `codes`, whose bits
// 4-7 are zero: one mask register load and one masked add.
static inline __m512i with_fifth_bit(__m512i codes, const uint8_t* fifth, int g) {
  __mmask64 k;
  std::memcpy(&k, fifth + 8 * g, sizeof k);
  return _mm512_mask_add_epi8(codes, k, codes, _mm512_set1_epi8(0x10));
}

// R activation rows against one packed panel (Q4_1 and Q5_1 here in the tile's order, with
// their min term as one more FMA per sub-block; packed_avx512.cpp has ggml's).
// R is 1..8, or k_packed_max_act_rows for every type but Q6_K (whose two sums per chunk would
// not fit the registers). The activations are in the tiled form of tile_packed_acts for a group
// of `group` rows, codes and aux starting at this call's first row: every byte and scale the
// pass reads lies at a fixed distance from one pointer per chunk (with one pointer per row, 16
// rows ran out of general registers and the compiler parked pointers in vector registers,
// whose moves took the vector ports: 95 cycles per chunk against 82 tiled). REQ: how the pass
// asks for its lines ahead (packed_avx512_requests; with_requests picks this CPU's). Split:
// two integer sums per row up to 8 rows (packed_avx512_split_sums; with_split picks this CPU's).
template <weight_type WT, int R, avx512_requests REQ, bool Split = true>
void packed_tile(const uint8_t* panel, int64_t cols, const int8_t* codes, const float* aux, int group, float* out, int64_t out_stride,
                 __mmask16 lanes) {
  static_assert(R <= k_panel_max_act_rows || (R == k_packed_max_act_rows && WT != weight_type::q6_k));
  // Two integer sums per row up to 8 rows where the CPU wants them (Split); one at 16, where a
  // pass over all rows takes longer than one sum's chain of 8 latencies and the registers hold
  // no second set.
  constexpr bool k_split = Split && R <= k_panel_max_act_rows && WT != weight_type::q6_k;
  // With split sums, the high nibbles of the plain 4-bit types go in unshifted (16 x code, up
  // to 240: vpdpbusd's unsigned operand takes it) and acc1 is shifted back once per chunk,
  // exactly, since it holds a multiple of 16: one shift per chunk instead of one per group.
  constexpr bool k_high_unshifted = k_split && (WT == weight_type::q4_0 || WT == weight_type::q4_1 || WT == weight_type::q4_k);
  constexpr int64_t uc = packed_unit_cols(WT);
  constexpr int sub = WT == weight_type::q6_k ? 16 : 32;
  constexpr size_t ub = packed_unit_bytes(WT);
  constexpr size_t sc = packed_scales_at(WT);
  constexpr bool k_offset = WT == weight_type::q4_0 || WT == weight_type::q5_0 || WT == weight_type::q8_0 || WT == weight_type::q6_k;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i high4 = _mm512_set1_epi8(static_cast<char>(0xF0));
  __m512 f[R];
  TANDEM_UNROLL for (int r = 0; r < R; ++r) f[r] = _mm512_setzero_ps();
  for (int64_t u = 0; u < cols / uc; ++u) {
    const uint8_t* unit = panel + u * ub;
    __m512 d = _mm512_setzero_ps(), dmin = _mm512_setzero_ps();
    if constexpr (WT == weight_type::q4_k || WT == weight_type::q5_k) {
      d = f16x16(unit + sc);
      dmin = f16x16(unit + sc + 2 * R16);
    } else if constexpr (WT == weight_type::q6_k) {
      d = f16x16(unit + sc);
    }
    for (int ch = 0; ch < uc / 32; ++ch) {
      // Every line of this chunk's share of the stream, as far on as REQ says.
      constexpr size_t share = ub / (uc / 32);
      if constexpr (REQ == avx512_requests::l1) {
        for (size_t b = 0; b < share; b += 64) avx512::prefetch(unit, ch * share + k_prefetch_ahead + b);
      } else if constexpr (REQ == avx512_requests::l2_and_l1) {
        for (size_t b = 0; b < share; b += 64) {
          avx512::prefetch_l2(unit, ch * share + k_packed_l2_ahead_avx512 + b);
          avx512::prefetch(unit, ch * share + k_packed_l1_ahead_avx512 + b);
        }
      }
      const int64_t col0 = u * uc + ch * 32;
      // The chunk's activation codes and aux floats, each row at a constant distance from one
      // pointer. Hidden from the optimiser, which otherwise derives a pointer per row and,
      // short of general registers at 8 rows, parks them in vector registers: the moves back
      // took the vector ports (24 vmovq per chunk of 8 rows).
      const int8_t* ca = codes + (col0 / 32) * group * 32;
      const float* xa = aux + (col0 / sub) * group * k_panel_aux_per_sub;
      opaque(ca);
      opaque(xa);
      // Integer sums: for Q6_K acc0 holds the chunk's first 16 columns and acc1 the rest; for
      // the other types up to 8 rows the two split the groups and are added before the
      // conversion. One chain of 8 vpdpbusd per row is 8 latencies long, longer than the pass
      // over 8 rows takes at two vpdpbusd per cycle, and the core waited on it (measured: 8
      // rows 52 -> 49 cycles per chunk in L1, batched decode of 16 about 9% faster). A pass
      // over 16 rows outlasts the chain, and there acc0 takes everything.
      // Types whose codes carry an offset start from the activations' offset term, so the
      // sums are of the signed values (ggml's integer dot) and no float correction follows.
      __m512i acc0[R], acc1[k_split || WT == weight_type::q6_k ? R : 1];
      TANDEM_UNROLL for (int r = 0; r < R; ++r) {
        if constexpr (k_offset) {
          const float* x = xa + r * k_panel_aux_per_sub;
          acc0[r] = _mm512_set1_epi32(offset_term(x));
          if constexpr (WT == weight_type::q6_k)
            acc1[r] = _mm512_set1_epi32(offset_term(x + group * k_panel_aux_per_sub));
          else if constexpr (k_split)
            acc1[r] = _mm512_setzero_si512();
        } else {
          acc0[r] = _mm512_setzero_si512();
          if constexpr (k_split) acc1[r] = _mm512_setzero_si512();
        }
      }
      TANDEM_UNROLL for (int q = 0; q < (WT == weight_type::q8_0 ? 8 : 4); ++q) {
        __m512i lo, hi = _mm512_setzero_si512();
        if constexpr (WT == weight_type::q8_0) {
          lo = avx512::load64(unit + 64 * q);
        } else {
          const __m512i z = avx512::load64(unit + ch * 256 + 64 * q);
          lo = _mm512_and_si512(z, low4);
          hi = k_high_unshifted ? _mm512_and_si512(z, high4) : _mm512_and_si512(_mm512_srli_epi16(z, 4), low4);
          if constexpr (packed_has_fifth_bit(WT)) {
            const uint8_t* fifth = unit + packed_fifth_at(WT, ch);
            lo = with_fifth_bit(lo, fifth, q);
            hi = with_fifth_bit(hi, fifth, q + 4);
          }
          if constexpr (WT == weight_type::q6_k) {
            lo = _mm512_or_si512(lo, q6_high_pair(avx512::load64(unit + 2048 + ch * 128), q));
            hi = _mm512_or_si512(hi, q6_high_pair(avx512::load64(unit + 2048 + ch * 128 + 64), q));
          }
        }
        TANDEM_UNROLL for (int r = 0; r < R; ++r) {
          const int8_t* a = ca + r * 32;
          if constexpr (WT == weight_type::q8_0) {
            if constexpr (k_split) {
              if (q % 2 == 1)
                acc1[r] = dpbusd_bcast(acc1[r], lo, a + 4 * q);
              else
                acc0[r] = dpbusd_bcast(acc0[r], lo, a + 4 * q);
            } else {
              acc0[r] = dpbusd_bcast(acc0[r], lo, a + 4 * q);
            }
          } else {
            acc0[r] = dpbusd_bcast(acc0[r], lo, a + 4 * q);
            if constexpr (k_split || WT == weight_type::q6_k)
              acc1[r] = dpbusd_bcast(acc1[r], hi, a + 16 + 4 * q);
            else
              acc0[r] = dpbusd_bcast(acc0[r], hi, a + 16 + 4 * q);
          }
        }
      }
      // Scales and mins of the chunk's sub-blocks, then the float update per row.
      // s: the sub-block's index within the chunk (Q6_K: 0 or 1).
      auto update = [&](const __m512i(&acc)[R], __m512 scale, __m512 min, int64_t s) {
        TANDEM_UNROLL for (int r = 0; r < R; ++r) {
          const float* x = xa + (s * group + r) * k_panel_aux_per_sub;
          const __m512 t = _mm512_maskz_cvtepi32_ps(k_all16, acc[r]);
          f[r] = _mm512_fmadd_ps(t, _mm512_mul_ps(scale, _mm512_set1_ps(x[0])), f[r]);
          if constexpr (!k_offset) f[r] = _mm512_fmadd_ps(min, _mm512_set1_ps(x[1]), f[r]);
        }
      };
      const __m512 no_min = _mm512_setzero_ps();
      if constexpr (k_split) {
        TANDEM_UNROLL for (int r = 0; r < R; ++r) acc0[r] =
            _mm512_add_epi32(acc0[r], k_high_unshifted ? _mm512_maskz_srai_epi32(k_all16, acc1[r], 4) : acc1[r]);
      }
      if constexpr (WT == weight_type::q4_0 || WT == weight_type::q5_0 || WT == weight_type::q8_0) {
        update(acc0, f16x16(unit + sc), no_min, 0);
      } else if constexpr (WT == weight_type::q4_1 || WT == weight_type::q5_1) {
        update(acc0, f16x16(unit + sc), f16x16(unit + sc + 2 * R16), 0);
      } else if constexpr (WT == weight_type::q4_k || WT == weight_type::q5_k) {
        const uint8_t* at = unit + sc + 4 * R16;
        const __m512 s = _mm512_mul_ps(d, u8x16(at + R16 * ch));
        const __m512 m = negate(_mm512_mul_ps(dmin, u8x16(at + 8 * R16 + R16 * ch)));
        update(acc0, s, m, 0);
      } else {
        const uint8_t* at = unit + sc + 2 * R16;
        update(acc0, _mm512_mul_ps(d, i8x16(at + R16 * (2 * ch))), no_min, 0);
        update(acc1, _mm512_mul_ps(d, i8x16(at + R16 * (2 * ch + 1))), no_min, 1);
      }
    }
  }
  TANDEM_UNROLL for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(out + r * out_stride, lanes, f[r]);
}

// f.template operator()<REQ>() with the requests this CPU's passes of R rows of WT (tile
// order) take (packed_avx512_requests, a run-time choice): for one row any of the three, for
// several l1 or l2_and_l1, each compiled in.
template <weight_type WT, int R, class F>
static inline void with_requests(F&& f) {
  if constexpr (R != 1) {
    if (packed_avx512_requests(WT, R, sum_order::tile) == avx512_requests::l1) return f.template operator()<avx512_requests::l1>();
    return f.template operator()<avx512_requests::l2_and_l1>();
  } else {
    switch (packed_avx512_requests(WT, 1, sum_order::tile)) {
      case avx512_requests::none:
        return f.template operator()<avx512_requests::none>();
      case avx512_requests::l1:
        return f.template operator()<avx512_requests::l1>();
      case avx512_requests::l2_and_l1:
        return f.template operator()<avx512_requests::l2_and_l1>();
    }
  }
}

// f.template operator()<Split>() with whether this CPU's passes of R rows split their sums.
template <int R, class F>
static inline void with_split(F&& f) {
  if constexpr (R == k_panel_max_act_rows) {
    if (!g_packed_split_sums8) return f.template operator()<false>();
  }
  return f.template operator()<true>();
}

}  // namespace
}  // namespace tandem::kernels::cpu
