// AVX-512 VNNI products over packed weights (packed.h): the dispatch, the ggml-order Q4_1/Q5_1
// kernel and the widening for many-row products. The tile kernel is packed_tile_avx512.h.
#include <immintrin.h>

#include <algorithm>
#include <cassert>
#include <cstring>
#include <vector>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/packed.h"
#include "kernels/cpu/packed_tile_avx512.h"
#include "kernels/cpu/panel.h"
#include "kernels/cpu/panel_avx512.h"
#include "kernels/cpu/simd_avx512.h"

namespace tandem::kernels::cpu {
namespace {

// Widens one packed panel into panel.h's byte-per-code form (no transpose: the panel
// arrangement is already there), for products with many activation rows, which then reuse
// the wide codes instead of unpacking them on every pass.
template <weight_type WT>
void expand(const uint8_t* packed, int64_t cols, uint8_t* panel) {
  constexpr int64_t uc = packed_unit_cols(WT);
  constexpr int sub = WT == weight_type::q6_k ? 16 : 32;
  constexpr size_t ub = packed_unit_bytes(WT);
  constexpr size_t sc = packed_scales_at(WT);
  constexpr size_t sub_bytes = sub / 4 * 64 + 128;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  // Types whose codes carry an offset: min = offset * scale (panel.h).
  const __m512 offset = _mm512_set1_ps(static_cast<float>(panel_code_offset(WT)));
  for (int64_t u = 0; u < cols / uc; ++u) {
    const uint8_t* unit = packed + u * ub;
    for (int ch = 0; ch < uc / 32; ++ch) {
      const int64_t col0 = u * uc + ch * 32;
      auto group_at = [&](int g) { return panel + ((col0 + 4 * g) / sub) * sub_bytes + ((col0 + 4 * g) % sub) / 4 * 64; };
      auto scales_at = [&](int64_t c) { return reinterpret_cast<float*>(panel + (c / sub) * sub_bytes + sub / 4 * 64); };
      if constexpr (WT == weight_type::q8_0) {
        for (int g = 0; g < 8; ++g) _mm512_store_si512(group_at(g), avx512::load64(unit + 64 * g));
      } else {
        for (int q = 0; q < 4; ++q) {
          const __m512i z = avx512::load64(unit + ch * 256 + 64 * q);
          __m512i lo = _mm512_and_si512(z, low4), hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), low4);
          if constexpr (packed_has_fifth_bit(WT)) {
            const uint8_t* fifth = unit + packed_fifth_at(WT, ch);
            lo = with_fifth_bit(lo, fifth, q);
            hi = with_fifth_bit(hi, fifth, q + 4);
          }
          if constexpr (WT == weight_type::q6_k) {
            lo = _mm512_or_si512(lo, q6_high_pair(avx512::load64(unit + 2048 + ch * 128), q));
            hi = _mm512_or_si512(hi, q6_high_pair(avx512::load64(unit + 2048 + ch * 128 + 64), q));
          }
          _mm512_store_si512(group_at(q), lo);
          _mm512_store_si512(group_at(q + 4), hi);
        }
      }
      // Scales and mins, with the formulas of panel_decode_row.
      if constexpr (WT == weight_type::q4_0 || WT == weight_type::q5_0 || WT == weight_type::q8_0) {
        const __m512 d = f16x16(unit + sc);
        _mm512_store_ps(scales_at(col0), d);
        _mm512_store_ps(scales_at(col0) + 16, _mm512_mul_ps(d, offset));
      } else if constexpr (WT == weight_type::q4_1 || WT == weight_type::q5_1) {
        _mm512_store_ps(scales_at(col0), f16x16(unit + sc));
        _mm512_store_ps(scales_at(col0) + 16, f16x16(unit + sc + 2 * R16));
      } else if constexpr (WT == weight_type::q4_k || WT == weight_type::q5_k) {
        const uint8_t* at = unit + sc + 4 * R16;
        _mm512_store_ps(scales_at(col0), _mm512_mul_ps(f16x16(unit + sc), u8x16(at + R16 * ch)));
        const __m512 m = _mm512_mul_ps(f16x16(unit + sc + 2 * R16), u8x16(at + 8 * R16 + R16 * ch));
        _mm512_store_ps(scales_at(col0) + 16, negate(m));
      } else {
        const uint8_t* at = unit + sc + 2 * R16;
        const __m512 d = f16x16(unit + sc);
        for (int h = 0; h < 2; ++h) {
          const __m512 scale = _mm512_mul_ps(d, i8x16(at + R16 * (2 * ch + h)));
          _mm512_store_ps(scales_at(col0 + 16 * h), scale);
          _mm512_store_ps(scales_at(col0 + 16 * h) + 16, _mm512_mul_ps(scale, offset));
        }
      }
    }
  }
}

}  // namespace

void expand_packed_avx512(weight_type wt, const uint8_t* packed, int64_t cols, uint8_t* panel) {
  switch (wt) {
    case weight_type::q4_0:
      return expand<weight_type::q4_0>(packed, cols, panel);
    case weight_type::q4_1:
      return expand<weight_type::q4_1>(packed, cols, panel);
    case weight_type::q5_0:
      return expand<weight_type::q5_0>(packed, cols, panel);
    case weight_type::q5_1:
      return expand<weight_type::q5_1>(packed, cols, panel);
    case weight_type::q8_0:
      return expand<weight_type::q8_0>(packed, cols, panel);
    case weight_type::q4_k:
      return expand<weight_type::q4_k>(packed, cols, panel);
    case weight_type::q5_k:
      return expand<weight_type::q5_k>(packed, cols, panel);
    case weight_type::q6_k:
      return expand<weight_type::q6_k>(packed, cols, panel);
    default:
      return;
  }
}

void packed_dot_tiled_avx512(weight_type wt, const uint8_t* panel, int64_t cols, const int8_t* tiled_codes, const float* tiled_aux, int n_act,
                             float* out, int64_t out_stride, int n_w, sum_order order) {
  assert(!(has_ggml_order(wt) && order == sum_order::ggml) && "ggml-order Q4_1/Q5_1 reads panel_acts rows");
  const __mmask16 lanes = avx512::first16(n_w);
  auto rows = [&]<weight_type WT>() {
    if constexpr (WT != weight_type::q6_k) {
      if (n_act == k_packed_max_act_rows) {
        with_requests<WT, k_packed_max_act_rows>([&]<avx512_requests REQ>() {
          packed_tile<WT, k_packed_max_act_rows, REQ>(panel, cols, tiled_codes, tiled_aux, n_act, out, out_stride, lanes);
        });
        return;
      }
    }
    for (int r0 = 0; r0 < n_act; r0 += k_panel_max_act_rows) {
      avx512::with_act_rows(std::min(k_panel_max_act_rows, n_act - r0), [&]<int R>() {
        with_requests<WT, R>([&]<avx512_requests REQ>() {
          with_split<R>([&]<bool Split>() {
            packed_tile<WT, R, REQ, Split>(panel, cols, tiled_codes + r0 * 32, tiled_aux + r0 * k_panel_aux_per_sub, n_act, out + r0 * out_stride,
                                           out_stride, lanes);
          });
        });
      });
    }
  };
  switch (wt) {
    case weight_type::q4_0:
      return rows.template operator()<weight_type::q4_0>();
    case weight_type::q5_0:
      return rows.template operator()<weight_type::q5_0>();
    case weight_type::q8_0:
      return rows.template operator()<weight_type::q8_0>();
    case weight_type::q4_k:
      return rows.template operator()<weight_type::q4_k>();
    case weight_type::q5_k:
      return rows.template operator()<weight_type::q5_k>();
    case weight_type::q6_k:
      return rows.template operator()<weight_type::q6_k>();
    case weight_type::q4_1:
      if (order == sum_order::tile) return rows.template operator()<weight_type::q4_1>();
      return;
    case weight_type::q5_1:
      if (order == sum_order::tile) return rows.template operator()<weight_type::q5_1>();
      return;
    default:
      return;
  }
}

void packed_dot_avx512(weight_type wt, const uint8_t* panel, int64_t cols, const int8_t* codes, const float* aux, int n_act, float* out,
                       int64_t out_stride, int n_w, sum_order order) {
  if (has_ggml_order(wt) && order == sum_order::ggml) {
    auto run = [&]<weight_type WT>() {
      constexpr size_t ub = packed_unit_bytes(WT);
      constexpr size_t sc = packed_scales_at(WT);
      const __m512i low4 = _mm512_set1_epi8(0x0F);
      const avx512_requests requests = packed_avx512_requests(WT, n_act, sum_order::ggml);
      avx512::ggml_order_rows(
          cols / 32, codes, cols, aux, n_act, out, out_stride, avx512::first16(n_w),
          [&](int64_t b, int g) {
            const uint8_t* unit = panel + b * ub;
            const __m512i z = avx512::load64(unit + 64 * (g % 4));
            const __m512i c = g < 4 ? _mm512_and_si512(z, low4) : _mm512_and_si512(_mm512_srli_epi16(z, 4), low4);
            if constexpr (packed_has_fifth_bit(WT)) return with_fifth_bit(c, unit + packed_fifth_at(WT, 0), g);
            return c;
          },
          [&](int64_t b, __m512& d, __m512& m) {
            const uint8_t* unit = panel + b * ub;
            if (requests == avx512_requests::l1) {
              for (size_t l = 0; l < ub; l += 64) avx512::prefetch(unit, k_prefetch_ahead + l);
            } else if (requests == avx512_requests::l2_and_l1) {
              for (size_t l = 0; l < ub; l += 64) {
                avx512::prefetch_l2(unit, k_packed_l2_ahead_avx512 + l);
                avx512::prefetch(unit, k_packed_l1_ahead_avx512 + l);
              }
            }
            d = f16x16(unit + sc);
            m = f16x16(unit + sc + 2 * R16);
          });
    };
    if (wt == weight_type::q4_1)
      run.template operator()<weight_type::q4_1>();
    else
      run.template operator()<weight_type::q5_1>();
    return;
  }
  if (n_act == 1) {  // one row's tiled form is its panel_acts form
    packed_dot_tiled_avx512(wt, panel, cols, codes, aux, 1, out, out_stride, n_w, order);
    return;
  }
  thread_local std::vector<int8_t> tiled_codes;
  thread_local std::vector<float> tiled_aux;
  const auto aux_per_row = static_cast<int64_t>(panel_act_aux_floats(wt, cols, 1));
  for (int r0 = 0; r0 < n_act; r0 += k_packed_max_act_rows) {
    const int n = std::min(k_packed_max_act_rows, n_act - r0);
    tiled_codes.resize(static_cast<size_t>(n * cols));
    tiled_aux.resize(static_cast<size_t>(n * aux_per_row));
    tile_packed_acts(wt, cols, codes + r0 * cols, aux + r0 * aux_per_row, n, tiled_codes.data(), tiled_aux.data());
    packed_dot_tiled_avx512(wt, panel, cols, tiled_codes.data(), tiled_aux.data(), n, out + r0 * out_stride, out_stride, n_w, order);
  }
}

}  // namespace tandem::kernels::cpu
