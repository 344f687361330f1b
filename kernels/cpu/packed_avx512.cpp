// AVX-512 VNNI products over packed weights (packed.h). Per 32-column chunk the compact
// codes are widened to the 8 group registers of panel.h (nibble masks and shifts, Q6_K's high
// pairs shifted into bits 4-5), each row's activation bytes meet them as vpdpbusd broadcasts,
// and per sub-block one conversion and a few FMAs apply the 16 rows' scales. The panel is one
// sequential stream; decode still asks for every line a few KiB ahead (the hardware prefetcher
// alone leaves it waiting on memory, measured).
#include <immintrin.h>

#include <cstring>

#include "kernels/cpu/packed.h"
#include "kernels/cpu/panel.h"
#include "kernels/cpu/panel_avx512.h"
#include "kernels/cpu/simd_avx512.h"

namespace tandem::kernels::cpu {
namespace {

using avx512::act4;
using avx512::q6_high_pair;

constexpr int R16 = k_panel_rows;
constexpr __mmask16 k_all16 = 0xFFFF;
constexpr size_t k_prefetch_ahead = 4096;

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

template <weight_type WT>
constexpr size_t unit_bytes() {
  return WT == weight_type::q4_0 ? 4 * 64 + 2 * R16
       : WT == weight_type::q4_1 ? 4 * 64 + 4 * R16
       : WT == weight_type::q8_0 ? 8 * 64 + 2 * R16
       : WT == weight_type::q4_k ? 8 * 4 * 64 + 20 * R16
                                 : 8 * 4 * 64 + 8 * 2 * 64 + 18 * R16;
}

// R activation rows against one packed panel (every type but Q4_1 / Q5_1's ggml order).
template <weight_type WT, int R>
void packed_tile(const uint8_t* panel, int64_t cols, const int8_t* codes, const float* aux, float* out,
                 int64_t out_stride, __mmask16 lanes) {
  constexpr bool k_quant = WT == weight_type::q4_k || WT == weight_type::q6_k;
  constexpr int64_t uc = k_quant ? 256 : 32;
  constexpr int sub = WT == weight_type::q6_k ? 16 : 32;
  constexpr size_t ub = unit_bytes<WT>();
  const int64_t nsub = cols / sub;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  __m512 f[R];
  TANDEM_UNROLL for (int r = 0; r < R; ++r) f[r] = _mm512_setzero_ps();
  for (int64_t u = 0; u < cols / uc; ++u) {
    const uint8_t* unit = panel + u * ub;
    __m512 d = _mm512_setzero_ps(), dmin = _mm512_setzero_ps();
    if constexpr (WT == weight_type::q4_k) {
      d = f16x16(unit + 2048);
      dmin = f16x16(unit + 2048 + 2 * R16);
    } else if constexpr (WT == weight_type::q6_k) {
      d = f16x16(unit + 3072);
    }
    for (int ch = 0; ch < uc / 32; ++ch) {
      // Every line of this chunk's share of the stream, k_prefetch_ahead bytes on.
      constexpr size_t share = ub / (uc / 32);
      for (size_t b = 0; b < share; b += 64) avx512::prefetch(unit, ch * share + k_prefetch_ahead + b);
      const int64_t col0 = u * uc + ch * 32;
      // Integer sums: acc0 for the chunk (or its first 16 columns for Q6_K), acc1 the rest.
      __m512i acc0[R], acc1[R];
      TANDEM_UNROLL for (int r = 0; r < R; ++r) acc0[r] = acc1[r] = _mm512_setzero_si512();
      TANDEM_UNROLL for (int q = 0; q < (WT == weight_type::q8_0 ? 8 : 4); ++q) {
        __m512i lo, hi = _mm512_setzero_si512();
        if constexpr (WT == weight_type::q8_0) {
          lo = avx512::load64(unit + 64 * q);
        } else {
          const __m512i z = avx512::load64(unit + ch * 256 + 64 * q);
          lo = _mm512_and_si512(z, low4);
          hi = _mm512_and_si512(_mm512_srli_epi16(z, 4), low4);
          if constexpr (WT == weight_type::q6_k) {
            lo = _mm512_or_si512(lo, q6_high_pair(avx512::load64(unit + 2048 + ch * 128), q));
            hi = _mm512_or_si512(hi, q6_high_pair(avx512::load64(unit + 2048 + ch * 128 + 64), q));
          }
        }
        TANDEM_UNROLL for (int r = 0; r < R; ++r) {
          const int8_t* a = codes + r * cols + col0;
          if constexpr (WT == weight_type::q8_0) {
            acc0[r] = _mm512_dpbusd_epi32(acc0[r], lo, _mm512_set1_epi32(act4(a + 4 * q)));
          } else {
            acc0[r] = _mm512_dpbusd_epi32(acc0[r], lo, _mm512_set1_epi32(act4(a + 4 * q)));
            if constexpr (WT == weight_type::q6_k)
              acc1[r] = _mm512_dpbusd_epi32(acc1[r], hi, _mm512_set1_epi32(act4(a + 16 + 4 * q)));
            else
              acc0[r] = _mm512_dpbusd_epi32(acc0[r], hi, _mm512_set1_epi32(act4(a + 16 + 4 * q)));
          }
        }
      }
      // Scales and mins of the chunk's sub-blocks, then the float update per row.
      auto update = [&](const __m512i (&acc)[R], __m512 scale, __m512 min, int64_t s) {
        TANDEM_UNROLL for (int r = 0; r < R; ++r) {
          const float* x = aux + r * nsub * 2 + 2 * s;
          const __m512 t = _mm512_maskz_cvtepi32_ps(k_all16, acc[r]);
          f[r] = _mm512_fmadd_ps(t, _mm512_mul_ps(scale, _mm512_set1_ps(x[0])), f[r]);
          f[r] = _mm512_fmadd_ps(min, _mm512_set1_ps(x[1]), f[r]);
        }
      };
      if constexpr (WT == weight_type::q4_0) {
        const __m512 s = f16x16(unit + 256);
        update(acc0, s, _mm512_mul_ps(s, _mm512_set1_ps(-8.0f)), col0 / 32);
      } else if constexpr (WT == weight_type::q8_0) {
        const __m512 s = f16x16(unit + 512);
        update(acc0, s, _mm512_mul_ps(s, _mm512_set1_ps(-128.0f)), col0 / 32);
      } else if constexpr (WT == weight_type::q4_k) {
        const uint8_t* at = unit + 2048 + 4 * R16;
        const __m512 s = _mm512_mul_ps(d, u8x16(at + R16 * ch));
        const __m512 m = negate(_mm512_mul_ps(dmin, u8x16(at + 8 * R16 + R16 * ch)));
        update(acc0, s, m, col0 / 32);
      } else {
        const uint8_t* at = unit + 3072 + 2 * R16;
        const __m512 s0 = _mm512_mul_ps(d, i8x16(at + R16 * (2 * ch)));
        const __m512 s1 = _mm512_mul_ps(d, i8x16(at + R16 * (2 * ch + 1)));
        update(acc0, s0, _mm512_mul_ps(s0, _mm512_set1_ps(-32.0f)), col0 / 16);
        update(acc1, s1, _mm512_mul_ps(s1, _mm512_set1_ps(-32.0f)), col0 / 16 + 1);
      }
    }
  }
  TANDEM_UNROLL for (int r = 0; r < R; ++r) _mm512_mask_storeu_ps(out + r * out_stride, lanes, f[r]);
}

// Widens one packed panel into panel.h's byte-per-code form (no transpose: the panel
// arrangement is already there), for products with many activation rows, which then reuse
// the wide codes instead of unpacking them on every pass.
template <weight_type WT>
void expand(const uint8_t* packed, int64_t cols, uint8_t* panel) {
  constexpr bool k_quant = WT == weight_type::q4_k || WT == weight_type::q6_k;
  constexpr int64_t uc = k_quant ? 256 : 32;
  constexpr int sub = WT == weight_type::q6_k ? 16 : 32;
  constexpr size_t ub = unit_bytes<WT>();
  constexpr size_t sub_bytes = sub / 4 * 64 + 128;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
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
          if constexpr (WT == weight_type::q6_k) {
            lo = _mm512_or_si512(lo, q6_high_pair(avx512::load64(unit + 2048 + ch * 128), q));
            hi = _mm512_or_si512(hi, q6_high_pair(avx512::load64(unit + 2048 + ch * 128 + 64), q));
          }
          _mm512_store_si512(group_at(q), lo);
          _mm512_store_si512(group_at(q + 4), hi);
        }
      }
      // Scales and mins, with the formulas of panel_decode_row.
      if constexpr (WT == weight_type::q4_0 || WT == weight_type::q8_0) {
        const __m512 d = f16x16(unit + (WT == weight_type::q4_0 ? 256 : 512));
        _mm512_store_ps(scales_at(col0), d);
        _mm512_store_ps(scales_at(col0) + 16, _mm512_mul_ps(d, _mm512_set1_ps(WT == weight_type::q4_0 ? -8.0f : -128.0f)));
      } else if constexpr (WT == weight_type::q4_1) {
        _mm512_store_ps(scales_at(col0), f16x16(unit + 256));
        _mm512_store_ps(scales_at(col0) + 16, f16x16(unit + 256 + 2 * R16));
      } else if constexpr (WT == weight_type::q4_k) {
        const uint8_t* at = unit + 2048 + 4 * R16;
        _mm512_store_ps(scales_at(col0), _mm512_mul_ps(f16x16(unit + 2048), u8x16(at + R16 * ch)));
        const __m512 m = _mm512_mul_ps(f16x16(unit + 2048 + 2 * R16), u8x16(at + 8 * R16 + R16 * ch));
        _mm512_store_ps(scales_at(col0) + 16, negate(m));
      } else {
        const uint8_t* at = unit + 3072 + 2 * R16;
        const __m512 d = f16x16(unit + 3072);
        for (int h = 0; h < 2; ++h) {
          const __m512 sc = _mm512_mul_ps(d, i8x16(at + R16 * (2 * ch + h)));
          _mm512_store_ps(scales_at(col0 + 16 * h), sc);
          _mm512_store_ps(scales_at(col0 + 16 * h) + 16, _mm512_mul_ps(sc, _mm512_set1_ps(-32.0f)));
        }
      }
    }
  }
}

}  // namespace

void expand_packed_avx512(weight_type wt, const uint8_t* packed, int64_t cols, uint8_t* panel) {
  switch (wt) {
    case weight_type::q4_0: return expand<weight_type::q4_0>(packed, cols, panel);
    case weight_type::q4_1: return expand<weight_type::q4_1>(packed, cols, panel);
    case weight_type::q8_0: return expand<weight_type::q8_0>(packed, cols, panel);
    case weight_type::q4_k: return expand<weight_type::q4_k>(packed, cols, panel);
    case weight_type::q6_k: return expand<weight_type::q6_k>(packed, cols, panel);
    default: return;
  }
}

void packed_dot_avx512(weight_type wt, const uint8_t* panel, int64_t cols, const int8_t* codes, const float* aux,
                       int n_act, float* out, int64_t out_stride, int n_w) {
  const __mmask16 lanes = avx512::first16(n_w);
  auto rows = [&]<weight_type WT>() {
    avx512::with_act_rows(n_act, [&]<int R>() { packed_tile<WT, R>(panel, cols, codes, aux, out, out_stride, lanes); });
  };
  switch (wt) {
    case weight_type::q4_0: return rows.template operator()<weight_type::q4_0>();
    case weight_type::q8_0: return rows.template operator()<weight_type::q8_0>();
    case weight_type::q4_k: return rows.template operator()<weight_type::q4_k>();
    case weight_type::q6_k: return rows.template operator()<weight_type::q6_k>();
    case weight_type::q4_1: {
      constexpr size_t ub = unit_bytes<weight_type::q4_1>();
      const __m512i low4 = _mm512_set1_epi8(0x0F);
      avx512::ggml_order_rows(
          cols / 32, codes, cols, aux, n_act, out, out_stride, lanes,
          [&](int64_t b, int g) {
            const uint8_t* unit = panel + b * ub;
            const __m512i z = avx512::load64(unit + 64 * (g % 4));
            return g < 4 ? _mm512_and_si512(z, low4) : _mm512_and_si512(_mm512_srli_epi16(z, 4), low4);
          },
          [&](int64_t b, __m512& d, __m512& m) {
            const uint8_t* unit = panel + b * ub;
            for (size_t l = 0; l < ub; l += 64) avx512::prefetch(unit, k_prefetch_ahead + l);
            d = f16x16(unit + 256);
            m = f16x16(unit + 256 + 2 * R16);
          });
      return;
    }
    default:
      return;
  }
}

}  // namespace tandem::kernels::cpu
