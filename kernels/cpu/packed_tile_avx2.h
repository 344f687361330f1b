// The AVX2 kernels over packed weights (packed.h): they let CPUs without AVX-512 load packed
// weights and read one stream per product. Shared by packed_avx2.cpp and, with AVX-VNNI
// (vpdpbusd on ymm registers: Intel Alder Lake and later, AMD Zen 5), packed_vnni_avx2.cpp.
// Include only from *_avx2.cpp files: everything is in an unnamed namespace, so each file
// compiles its own copy for its own instruction set, as packed_tile_avx512.h.
//
// A 64-byte group register of packed.h holds rows 0-7 in its first 32 bytes and rows 8-15 in
// the rest, so a ymm register is half a panel: each half takes its own codes, scales and
// float accumulators, and the pair of halves is the AVX-512 kernel's one register.
//
// With AVX-VNNI the integer dot is vpdpbusd, as on AVX-512. Without it, it is vpmaddubsw
// (code x activation byte pairs into int16, saturating) then vpmaddwd by ones (int16 pairs
// into int32). The int16 sums of several groups are added before the widening while they
// cannot overflow: a pair sum is at most 2 * 127 * the largest code (the activation codes are
// within +-127), so 8 sums of 4-bit codes, 4 of 5-bit and 2 of 6-bit fit in int16. Q8_0's
// codes (q + 128, up to 255) would saturate vpmaddubsw, so they are made signed again and
// multiplied as |q| x sign(a, q), as the row tiles do. Every integer sum is exact and every
// float step is the AVX-512 tile kernel's (packed_tile_avx512.h), so all three give the same
// bits; Q4_1 / Q5_1 in ggml's order give the bits of the AVX2 row tiles
// (vec_dot_avx2.cpp), as on AVX-512.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/packed.h"
#include "kernels/cpu/panel.h"
#include "kernels/cpu/simd_avx2.h"

namespace tandem::kernels::cpu {
namespace {

using avx2::fifth_bits;
using avx2::load32;

constexpr int R16 = k_panel_rows;
// Activation rows one pass carries: one float and one integer sum per row (a half panel at a
// time), next to the codes, fit the 16 ymm registers up to 4; 5 and 6 measured no faster.
constexpr int k_avx2_pass_rows = 4;

static inline __m256i bcast4(const int8_t* p) { return _mm256_set1_epi32(panel_act4(p)); }
static inline __m256 f16x8(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
static inline __m256 u8x8(const uint8_t* p) { return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))); }
static inline __m256 i8x8(const uint8_t* p) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))); }
static inline __m256 negate(__m256 x) { return _mm256_xor_ps(x, _mm256_set1_ps(-0.0f)); }
// Asks for the line `offset` bytes into p's stream ahead: twice, into L2 far and into L1 near,
// or once close ahead as a non-temporal request (packed.h says which and why). Always
// inlined: GCC 12 finds a function whose only effects are prefetches const (or pure), and
// drops the calls to one it leaves out of line (seen with a larger body in an experiment: no
// request was left).
__attribute__((always_inline)) static inline void prefetch(const void* p, size_t offset, size_t near_ahead, bool two_levels) {
  const char* at = reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(p) + offset);
  if (two_levels) {
    _mm_prefetch(at + k_packed_l2_ahead_avx2, _MM_HINT_T1);
    _mm_prefetch(at + k_packed_l1_ahead_avx2, _MM_HINT_T0);
  } else {
    _mm_prefetch(at + near_ahead, _MM_HINT_NTA);
  }
}
static inline __m256i widen(__m256i s16) { return _mm256_madd_epi16(s16, _mm256_set1_epi16(1)); }
// acc + the dot of unsigned codes u and signed bytes s, 4 byte products per int32 lane.
template <bool VNNI>
static inline __m256i dot_add(__m256i acc, __m256i u, __m256i s) {
  if constexpr (VNNI) {
#ifdef __AVXVNNI__
    return _mm256_dpbusd_avx_epi32(acc, u, s);
#else
    static_assert(!VNNI, "the AVX-VNNI kernels are compiled with -mavxvnni (packed_vnni_avx2.cpp)");
#endif
  } else {
    return _mm256_add_epi32(acc, widen(_mm256_maddubs_epi16(u, s)));
  }
}

// Q6_K's high bit pair of group q (bits 2q, 2q+1 of each byte) moved to bits 4, 5.
static inline __m256i q6_high_pair(__m256i h, int q) {
  const __m256i m30 = _mm256_set1_epi8(0x30);
  switch (q) {
    case 0:
      return _mm256_and_si256(_mm256_slli_epi16(h, 4), m30);
    case 1:
      return _mm256_and_si256(_mm256_slli_epi16(h, 2), m30);
    case 2:
      return _mm256_and_si256(h, m30);
    default:
      return _mm256_and_si256(_mm256_srli_epi16(h, 2), m30);
  }
}

// vpmaddubsw results one int16 sum may take before it is widened (see the top).
template <weight_type WT>
constexpr int sums_per_int16() {
  return WT == weight_type::q6_k ? 2 : packed_has_fifth_bit(WT) ? 4 : 8;
}

// The codes of groups q (lo) and q + 4 (hi) of chunk ch, half h (rows 8h..8h+7), unsigned
// (Q8_0: q is every group, lo its codes, hi unused; signed without VNNI, see the top).
template <weight_type WT, bool VNNI>
static inline void group_codes(const uint8_t* unit, int ch, int h, int q, __m256i& lo, __m256i& hi) {
  if constexpr (WT == weight_type::q8_0) {
    lo = load32(unit + 64 * q + 32 * h);
    if constexpr (!VNNI) lo = _mm256_xor_si256(lo, _mm256_set1_epi8(static_cast<char>(0x80)));
    hi = lo;
  } else {
    const __m256i low4 = _mm256_set1_epi8(0x0F);
    const __m256i z = load32(unit + ch * 256 + 64 * q + 32 * h);
    lo = _mm256_and_si256(z, low4);
    hi = _mm256_and_si256(_mm256_srli_epi16(z, 4), low4);
    if constexpr (packed_has_fifth_bit(WT)) {
      const uint8_t* fifth = unit + packed_fifth_at(WT, ch);
      lo = _mm256_or_si256(lo, fifth_bits(fifth + 8 * q + 4 * h));
      hi = _mm256_or_si256(hi, fifth_bits(fifth + 8 * (q + 4) + 4 * h));
    }
    if constexpr (WT == weight_type::q6_k) {
      lo = _mm256_or_si256(lo, q6_high_pair(load32(unit + 2048 + ch * 128 + 32 * h), q));
      hi = _mm256_or_si256(hi, q6_high_pair(load32(unit + 2048 + ch * 128 + 64 + 32 * h), q));
    }
  }
}

// Lanes [0, n) of v to p (n may be 0..8).
static inline void store_lanes(float* p, __m256 v, int n) {
  if (n >= 8) {
    _mm256_storeu_ps(p, v);
  } else if (n > 0) {
    const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    _mm256_maskstore_ps(p, lanes, v);
  }
}

// R activation rows (panel_acts rows: codes cols apart, aux nsub * 3 floats apart) against
// halves [h0, h0 + H) of one packed panel, in the tile kernel's float order (Q4_1 / Q5_1 too:
// their tile order). Both halves in one pass (H = 2) keep 2R float sums live; one half per
// pass (H = 1) leaves room for more rows, and the second pass reads the panel from cache.
template <weight_type WT, int R, bool VNNI, int H>
void packed_pass(const uint8_t* panel, int64_t cols, const int8_t* codes, const float* aux, float* out, int64_t out_stride, int n_w, int h0) {
  constexpr int64_t uc = packed_unit_cols(WT);
  constexpr int sub = WT == weight_type::q6_k ? 16 : 32;
  constexpr size_t ub = packed_unit_bytes(WT);
  constexpr size_t sc = packed_scales_at(WT);
  // Codes with an offset start from the activations' offset term (Q8_0's only with VNNI: without
  // it its codes are made signed).
  constexpr bool k_offset = WT == weight_type::q4_0 || WT == weight_type::q5_0 || WT == weight_type::q6_k || (WT == weight_type::q8_0 && VNNI);
  constexpr int per16 = sums_per_int16<WT>();
  const int64_t nsub = cols / sub;
  const int64_t aux_row = nsub * k_panel_aux_per_sub;
  const size_t near_ahead = packed_near_ahead_avx2(WT);
  const bool two_levels = R > 2 || packed_avx2_two_levels(WT, sum_order::tile);
  __m256 f[H][R];
  for (int h = 0; h < H; ++h) TANDEM_UNROLL for (int r = 0; r < R; ++r) f[h][r] = _mm256_setzero_ps();
  for (int64_t u = 0; u < cols / uc; ++u) {
    const uint8_t* unit = panel + u * ub;
    for (int ch = 0; ch < uc / 32; ++ch) {
      constexpr size_t share = ub / (uc / 32);
      if (h0 == 0)
        for (size_t b = 0; b < share; b += 64) prefetch(unit, ch * share + b, near_ahead, two_levels);
      const int64_t col0 = u * uc + ch * 32;
      for (int hh = 0; hh < H; ++hh) {
        const int h = h0 + hh;
        // The activations are broadcast again for each half: left to itself the compiler keeps
        // both halves' broadcasts in registers, runs out of them and spills (measured).
        const int8_t* act = codes;
        asm("" : "+r"(act));
        // acc0: the chunk's sums (Q6_K: its first 16 columns; acc1 the other 16), int32. With
        // VNNI and few rows acc1 also takes half the groups (added before the conversion), so
        // each vpdpbusd chain is half as long, as the AVX-512 kernel does.
        constexpr bool k_split = WT == weight_type::q6_k || (VNNI && R <= 2);
        __m256i acc0[R], acc1[k_split ? R : 1];
        TANDEM_UNROLL for (int r = 0; r < R; ++r) {
          const float* x = aux + r * aux_row + (col0 / sub) * k_panel_aux_per_sub;
          acc0[r] = k_offset ? _mm256_set1_epi32(panel_offset_term(x)) : _mm256_setzero_si256();
          if constexpr (WT == weight_type::q6_k)
            acc1[r] = _mm256_set1_epi32(panel_offset_term(x + k_panel_aux_per_sub));
          else if constexpr (k_split)
            acc1[r] = _mm256_setzero_si256();
        }
        if constexpr (VNNI) {
          TANDEM_UNROLL for (int q = 0; q < (WT == weight_type::q8_0 ? 8 : 4); ++q) {
            __m256i lo, hi;
            group_codes<WT, VNNI>(unit, ch, h, q, lo, hi);
            TANDEM_UNROLL for (int r = 0; r < R; ++r) {
              const int8_t* a = act + r * cols + col0;
              if constexpr (WT == weight_type::q8_0) {
                if (k_split && q % 2 == 1)
                  acc1[r] = dot_add<VNNI>(acc1[r], lo, bcast4(a + 4 * q));
                else
                  acc0[r] = dot_add<VNNI>(acc0[r], lo, bcast4(a + 4 * q));
              } else {
                acc0[r] = dot_add<VNNI>(acc0[r], lo, bcast4(a + 4 * q));
                if constexpr (k_split)
                  acc1[r] = dot_add<VNNI>(acc1[r], hi, bcast4(a + 16 + 4 * q));
                else
                  acc0[r] = dot_add<VNNI>(acc0[r], hi, bcast4(a + 16 + 4 * q));
              }
            }
          }
          if constexpr (k_split && WT != weight_type::q6_k) TANDEM_UNROLL for (int r = 0; r < R; ++r) acc0[r] = _mm256_add_epi32(acc0[r], acc1[r]);
        } else if constexpr (WT == weight_type::q8_0) {
          TANDEM_UNROLL for (int q = 0; q < 8; ++q) {
            __m256i w, unused;
            group_codes<WT, VNNI>(unit, ch, h, q, w, unused);
            const __m256i abs_w = _mm256_sign_epi8(w, w);
            TANDEM_UNROLL for (int r = 0; r < R; ++r) {
              const __m256i a = _mm256_sign_epi8(bcast4(act + r * cols + col0 + 4 * q), w);
              acc0[r] = _mm256_add_epi32(acc0[r], widen(_mm256_maddubs_epi16(abs_w, a)));
            }
          }
        } else {
          // int16 sums per row, widened every q_per_sum groups q: one for both registers of a
          // group pair (Q6_K: one per register, as they are two sub-blocks).
          constexpr int k_sums = WT == weight_type::q6_k ? 2 : 1;
          constexpr int q_per_sum = per16 / (3 - k_sums);
          static_assert(4 % q_per_sum == 0);
          __m256i s16[k_sums][R];
          TANDEM_UNROLL for (int q = 0; q < 4; ++q) {
            __m256i lo, hi;
            group_codes<WT, VNNI>(unit, ch, h, q, lo, hi);
            TANDEM_UNROLL for (int r = 0; r < R; ++r) {
              const int8_t* a = act + r * cols + col0;
              const __m256i pl = _mm256_maddubs_epi16(lo, bcast4(a + 4 * q));
              const __m256i ph = _mm256_maddubs_epi16(hi, bcast4(a + 16 + 4 * q));
              if constexpr (k_sums == 2) {
                s16[0][r] = q % q_per_sum == 0 ? pl : _mm256_add_epi16(s16[0][r], pl);
                s16[1][r] = q % q_per_sum == 0 ? ph : _mm256_add_epi16(s16[1][r], ph);
              } else {
                const __m256i p = _mm256_add_epi16(pl, ph);
                s16[0][r] = q % q_per_sum == 0 ? p : _mm256_add_epi16(s16[0][r], p);
              }
            }
            if (q % q_per_sum == q_per_sum - 1) {
              TANDEM_UNROLL for (int r = 0; r < R; ++r) {
                acc0[r] = _mm256_add_epi32(acc0[r], widen(s16[0][r]));
                if constexpr (k_sums == 2) acc1[r] = _mm256_add_epi32(acc1[r], widen(s16[1][r]));
              }
            }
          }
        }
        auto update = [&](const __m256i(&acc)[R], __m256 scale, __m256 min, int64_t s) {
          TANDEM_UNROLL for (int r = 0; r < R; ++r) {
            const float* x = aux + r * aux_row + s * k_panel_aux_per_sub;
            const __m256 t = _mm256_cvtepi32_ps(acc[r]);
            f[hh][r] = _mm256_fmadd_ps(t, _mm256_mul_ps(scale, _mm256_set1_ps(x[0])), f[hh][r]);
            if constexpr (!k_offset && WT != weight_type::q8_0) f[hh][r] = _mm256_fmadd_ps(min, _mm256_set1_ps(x[1]), f[hh][r]);
          }
        };
        const __m256 no_min = _mm256_setzero_ps();
        if constexpr (WT == weight_type::q4_0 || WT == weight_type::q5_0 || WT == weight_type::q8_0) {
          update(acc0, f16x8(unit + sc + 16 * h), no_min, col0 / 32);
        } else if constexpr (WT == weight_type::q4_1 || WT == weight_type::q5_1) {
          update(acc0, f16x8(unit + sc + 16 * h), f16x8(unit + sc + 2 * R16 + 16 * h), col0 / 32);
        } else if constexpr (WT == weight_type::q4_k || WT == weight_type::q5_k) {
          const uint8_t* at = unit + sc + 4 * R16;
          const __m256 s = _mm256_mul_ps(f16x8(unit + sc + 16 * h), u8x8(at + R16 * ch + 8 * h));
          const __m256 m = negate(_mm256_mul_ps(f16x8(unit + sc + 2 * R16 + 16 * h), u8x8(at + 8 * R16 + R16 * ch + 8 * h)));
          update(acc0, s, m, col0 / 32);
        } else {
          const uint8_t* at = unit + sc + 2 * R16;
          const __m256 d = f16x8(unit + sc + 16 * h);
          update(acc0, _mm256_mul_ps(d, i8x8(at + R16 * (2 * ch) + 8 * h)), no_min, col0 / 16);
          update(acc1, _mm256_mul_ps(d, i8x8(at + R16 * (2 * ch + 1) + 8 * h)), no_min, col0 / 16 + 1);
        }
      }
    }
  }
  for (int hh = 0; hh < H; ++hh)
    TANDEM_UNROLL for (int r = 0; r < R; ++r) store_lanes(out + r * out_stride + 8 * (h0 + hh), f[hh][r], n_w - 8 * (h0 + hh));
}

// R activation rows against one packed panel: up to 2 rows (decode) both halves at once, so
// the pass over the panel streams it with every line's work next to its load; more rows one
// half at a time.
template <weight_type WT, int R, bool VNNI>
void packed_rows(const uint8_t* panel, int64_t cols, const int8_t* codes, const float* aux, float* out, int64_t out_stride, int n_w) {
  if constexpr (R <= 2) {
    packed_pass<WT, R, VNNI, 2>(panel, cols, codes, aux, out, out_stride, n_w, 0);
  } else {
    packed_pass<WT, R, VNNI, 1>(panel, cols, codes, aux, out, out_stride, n_w, 0);
    if (n_w > 8) packed_pass<WT, R, VNNI, 1>(panel, cols, codes, aux, out, out_stride, n_w, 1);
  }
}

// One activation row of Q4_1 / Q5_1 in ggml's x86 order (packed.h: sum_order::ggml): lane j
// of the row tile's accumulator is this kernel's group j, so each half keeps 8 float sums, one
// per group, plus the fused sum of m * s, and ends with the row tile's lane-sum tree. The two
// halves run one after the other (16 sums would not fit the registers); the second reads the
// panel from cache. Each pass asks for its share of every unit's lines ahead: with all of them
// asked in the first, memory had nothing to do through the second (the split streams 14-17%
// faster on a Zen 2).
template <weight_type WT, bool VNNI>
void packed_row_ggml(const uint8_t* panel, int64_t cols, const int8_t* codes, const float* aux, float* out, int n_w) {
  constexpr size_t ub = packed_unit_bytes(WT);
  constexpr size_t sc = packed_scales_at(WT);
  constexpr size_t split = (ub / 64 + 1) / 2 * 64;  // the first pass's lines of a unit, when there are two
  const int64_t nb = cols / 32;
  const int passes = n_w > 8 ? 2 : 1;
  const size_t near_ahead = packed_near_ahead_avx2(WT);
  const bool two_levels = packed_avx2_two_levels(WT, sum_order::ggml);
  for (int h = 0; h < passes; ++h) {
    __m256 f[8], msum = _mm256_setzero_ps();
    TANDEM_UNROLL for (int g = 0; g < 8; ++g) f[g] = _mm256_setzero_ps();
    const size_t l_begin = h == 0 ? 0 : split, l_end = passes == 2 && h == 0 ? split : ub;
    for (int64_t b = 0; b < nb; ++b) {
      const uint8_t* unit = panel + b * ub;
      for (size_t l = l_begin; l < l_end; l += 64) prefetch(unit, l, near_ahead, two_levels);
      const float* x = aux + b * k_panel_aux_per_sub;
      const __m256 dd = _mm256_mul_ps(f16x8(unit + sc + 16 * h), _mm256_set1_ps(x[0]));
      msum = _mm256_fmadd_ps(f16x8(unit + sc + 2 * R16 + 16 * h), _mm256_set1_ps(x[1]), msum);
      TANDEM_UNROLL for (int q = 0; q < 4; ++q) {
        __m256i lo, hi;
        group_codes<WT, VNNI>(unit, 0, h, q, lo, hi);
        const int8_t* a = codes + b * 32;
        const __m256i dl = dot_add<VNNI>(_mm256_setzero_si256(), lo, bcast4(a + 4 * q));
        const __m256i dh = dot_add<VNNI>(_mm256_setzero_si256(), hi, bcast4(a + 16 + 4 * q));
        f[q] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(dl), f[q]);
        f[q + 4] = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(dh), f[q + 4]);
      }
    }
    const __m256 t0 = _mm256_add_ps(f[0], f[4]), t1 = _mm256_add_ps(f[1], f[5]);
    const __m256 t2 = _mm256_add_ps(f[2], f[6]), t3 = _mm256_add_ps(f[3], f[7]);
    const __m256 sum = _mm256_add_ps(_mm256_add_ps(t0, t2), _mm256_add_ps(t1, t3));
    store_lanes(out + 8 * h, _mm256_add_ps(sum, msum), n_w - 8 * h);
  }
}

template <weight_type WT, bool VNNI>
void packed_all_rows(const uint8_t* panel, int64_t cols, const int8_t* codes, const float* aux, int n_act, float* out, int64_t out_stride, int n_w) {
  const auto aux_row = static_cast<int64_t>(cols / (WT == weight_type::q6_k ? 16 : 32)) * k_panel_aux_per_sub;
  for (int r0 = 0; r0 < n_act; r0 += k_avx2_pass_rows) {
    const int8_t* c = codes + r0 * cols;
    const float* x = aux + r0 * aux_row;
    float* o = out + r0 * out_stride;
    switch (n_act - r0 < k_avx2_pass_rows ? n_act - r0 : k_avx2_pass_rows) {  // no std::min: see simd_avx2.h
      case 1:
        packed_rows<WT, 1, VNNI>(panel, cols, c, x, o, out_stride, n_w);
        break;
      case 2:
        packed_rows<WT, 2, VNNI>(panel, cols, c, x, o, out_stride, n_w);
        break;
      case 3:
        packed_rows<WT, 3, VNNI>(panel, cols, c, x, o, out_stride, n_w);
        break;
      default:
        packed_rows<WT, 4, VNNI>(panel, cols, c, x, o, out_stride, n_w);
        break;
    }
  }
}

// packed_dot_avx2's contract (packed.h).
template <bool VNNI>
void packed_dot_avx2_impl(weight_type wt, const uint8_t* panel, int64_t cols, const int8_t* codes, const float* aux, int n_act, float* out,
                          int64_t out_stride, int n_w, sum_order order) {
  if (has_ggml_order(wt) && order == sum_order::ggml) {
    const int64_t aux_row = cols / 32 * k_panel_aux_per_sub;
    for (int r = 0; r < n_act; ++r) {
      if (wt == weight_type::q4_1)
        packed_row_ggml<weight_type::q4_1, VNNI>(panel, cols, codes + r * cols, aux + r * aux_row, out + r * out_stride, n_w);
      else
        packed_row_ggml<weight_type::q5_1, VNNI>(panel, cols, codes + r * cols, aux + r * aux_row, out + r * out_stride, n_w);
    }
    return;
  }
  auto all = [&]<weight_type WT>() { packed_all_rows<WT, VNNI>(panel, cols, codes, aux, n_act, out, out_stride, n_w); };
  switch (wt) {
    case weight_type::q4_0:
      return all.template operator()<weight_type::q4_0>();
    case weight_type::q4_1:
      return all.template operator()<weight_type::q4_1>();
    case weight_type::q5_0:
      return all.template operator()<weight_type::q5_0>();
    case weight_type::q5_1:
      return all.template operator()<weight_type::q5_1>();
    case weight_type::q8_0:
      return all.template operator()<weight_type::q8_0>();
    case weight_type::q4_k:
      return all.template operator()<weight_type::q4_k>();
    case weight_type::q5_k:
      return all.template operator()<weight_type::q5_k>();
    case weight_type::q6_k:
      return all.template operator()<weight_type::q6_k>();
    default:
      return;
  }
}

}  // namespace
}  // namespace tandem::kernels::cpu
