// Products over expanded panels on the AMX tile unit (panel.h: panel_dot_amx). Built with
// -mamx-tile -mamx-int8 on top of the AVX-512 flags (kernels/CMakeLists.txt); reached only
// where amx_active().
//
// A panel's 32-element sub-block is already a tile operand: its 8 groups of 64 bytes (byte
// 4r + i of group g = code of weight row r, column 4g + i) are the K x N "VNNI" layout of a
// B tile with N = 16 weight rows, and up to 16 activation rows of 32 int8 codes (cols apart)
// are its M x K A tile. One tile product per sub-block gives the integer dots that
// panel_tile's 128 vpdpbusd build 4 columns at a time; the float epilogue is panel_tile's own,
// so every output has its bits (integer sums are exact, and the float steps are the same
// operations in the same order). The epilogue, not the tile product, is the cost, so the
// types whose codes carry an offset have it taken out of the panel first (panel_sign_codes:
// signed codes, tdpbssd): the sums are then the signed values' dots, equal to panel_tile's
// offset-started ones, and each output row saves an add and a broadcast load per sub-block
// (20% of the kernel on a 1024-column panel held in L1). Per sub-block and activation row
// what remains is one load, conversion, multiply and FMA (and the min term's FMA).
#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/panel.h"
#include "kernels/cpu/panel_avx512.h"
#include "kernels/cpu/simd_avx512.h"

namespace tandem::kernels::cpu {
namespace {

constexpr int S = 32;           // elements per sub-block (Q6_K's 16 are not taken: see panel_amx_supported)
constexpr int k_max_rows = 16;  // activation rows per pass: an A tile's rows, a C tile's rows
constexpr __mmask16 k_all16 = 0xFFFF;

// Tile registers: 0-3 C (M rows x 16 int32), one per sub-block in flight, so the products run
// k_ahead sub-blocks in front of the epilogue that reads their results (a dependent chain of
// products measured ~5 ns each); 4-5 A (M rows x 32 codes) and 6-7 B (8 rows of 64 bytes),
// alternating.
constexpr int k_c_tiles = 4;
constexpr int k_ahead = k_c_tiles - 1;
struct alignas(64) tile_config {
  uint8_t palette = 1;
  uint8_t start_row = 0;
  uint8_t reserved[14] = {};
  uint16_t bytes_per_row[16] = {};
  uint8_t rows[16] = {};
};
template <int M>
constexpr tile_config config_for() {
  tile_config c;
  for (int t = 0; t < k_c_tiles; ++t) {
    c.rows[t] = M;
    c.bytes_per_row[t] = 64;
  }
  for (int t = 4; t < 6; ++t) {
    c.rows[t] = M;
    c.bytes_per_row[t] = S;
  }
  for (int t = 6; t < 8; ++t) {
    c.rows[t] = S / 4;
    c.bytes_per_row[t] = 64;
  }
  return c;
}

// The row count whose configuration this thread's tile unit holds (0: none yet). The
// configuration is per thread and survives context switches with the rest of the register
// state; one variable for every shape (a static in configure_tiles would be one per shape).
thread_local int g_configured_rows = 0;

template <int M>
void configure_tiles() {
  alignas(64) static constexpr tile_config config = config_for<M>();
  if (g_configured_rows != M) {
    _tile_loadconfig(&config);
    g_configured_rows = M;
  }
}

// One sub-block's M x 16 integer dots: A tile of the activation rows (`a`, rows a_stride
// apart), B tile of the panel's groups, into dst (M rows of 16 int32). Signed: tdpbssd (signed
// codes), else tdpbsud. A macro: GCC's tile intrinsics paste their register numbers into the
// instruction text, so they must be literals.
#define TANDEM_TILE_DOTS(Signed, C, A, B, a, a_stride, b, dst) \
  do {                                                         \
    _tile_loadd(A, a, a_stride);                               \
    _tile_loadd(B, b, 64);                                     \
    _tile_zero(C);                                             \
    if constexpr (Signed)                                      \
      _tile_dpbssd(C, A, B);                                   \
    else                                                       \
      _tile_dpbsud(C, A, B);                                   \
    _tile_stored(C, dst, 64);                                  \
  } while (false)

// M activation rows against one panel; `Offset`: the type's codes carry an offset, which
// panel_sign_codes has taken out (signed codes), and the mins are not read.
template <int M, bool Offset>
void panel_pass_amx(const uint8_t* panel, int64_t cols, const int8_t* codes, const float* aux, float* out, int64_t out_stride, __mmask16 lanes) {
  constexpr size_t sub_bytes = S / 4 * 64 + 2 * 64;
  const int64_t nsub = cols / S;
  configure_tiles<M>();
  alignas(64) int32_t dots[k_c_tiles][M][16];
  auto multiply = [&](int64_t s) {
    const uint8_t* b = panel + s * sub_bytes;
    const int8_t* a = codes + s * S;
    int32_t* dst = dots[s % k_c_tiles][0];
    switch (s % k_c_tiles) {
      case 0:
        TANDEM_TILE_DOTS(Offset, 0, 4, 6, a, cols, b, dst);
        return;
      case 1:
        TANDEM_TILE_DOTS(Offset, 1, 5, 7, a, cols, b, dst);
        return;
      case 2:
        TANDEM_TILE_DOTS(Offset, 2, 4, 6, a, cols, b, dst);
        return;
      default:
        TANDEM_TILE_DOTS(Offset, 3, 5, 7, a, cols, b, dst);
        return;
    }
  };
  __m512 f[M];
  TANDEM_UNROLL for (int r = 0; r < M; ++r) f[r] = _mm512_setzero_ps();
  for (int64_t s = 0; s < k_ahead && s < nsub; ++s) multiply(s);
  for (int64_t s = 0; s < nsub; ++s) {
    if (s + k_ahead < nsub) multiply(s + k_ahead);
    const uint8_t* p = panel + s * sub_bytes;
    const __m512 sc = _mm512_load_ps(p + S / 4 * 64), mn = _mm512_load_ps(p + S / 4 * 64 + 64);
    const int32_t(&d)[M][16] = dots[s % k_c_tiles];
    TANDEM_UNROLL for (int r = 0; r < M; ++r) {
      const float* x = aux + (r * nsub + s) * k_panel_aux_per_sub;
      const __m512 t = _mm512_maskz_cvtepi32_ps(k_all16, _mm512_load_si512(d[r]));
      f[r] = _mm512_fmadd_ps(t, _mm512_mul_ps(sc, _mm512_set1_ps(x[0])), f[r]);
      if constexpr (!Offset) f[r] = _mm512_fmadd_ps(mn, _mm512_set1_ps(x[1]), f[r]);
    }
  }
  TANDEM_UNROLL for (int r = 0; r < M; ++r) _mm512_mask_storeu_ps(out + r * out_stride, lanes, f[r]);
}

#undef TANDEM_TILE_DOTS

}  // namespace

bool panel_amx_supported(weight_type wt) {
  // Q6_K's 16-element sub-blocks halve each tile product's work for the same epilogue: its
  // prefill measured no faster on the tiles, so it keeps the vector kernel.
  return panel_supported(wt) && panel_sub_elems(wt) == S && wt != weight_type::q4_1 && wt != weight_type::q5_1;
}

void panel_sign_codes(weight_type wt, uint8_t* panel, int64_t cols) {
  const int offset = panel_code_offset(wt);
  if (offset == 0) return;
  const int sub = panel_sub_elems(wt);
  const size_t sub_bytes = static_cast<size_t>(sub / 4 * 64 + 128);
  const __m512i by = _mm512_set1_epi8(static_cast<char>(offset));  // codes + offset, mod 256
  for (int64_t s = 0; s < cols / sub; ++s)
    for (int g = 0; g < sub / 4; ++g) {
      uint8_t* at = panel + static_cast<size_t>(s) * sub_bytes + 64 * g;
      _mm512_store_si512(at, _mm512_add_epi8(_mm512_load_si512(at), by));
    }
}

void panel_dot_amx(weight_type wt, const uint8_t* panel, int64_t cols, const int8_t* codes, const float* aux, int n_act, float* out,
                   int64_t out_stride, int n_w) {
  const int64_t aux_per_row = cols / S * k_panel_aux_per_sub;
  const __mmask16 lanes = avx512::first16(n_w);
  const bool offset = panel_code_offset(wt) != 0;
  // Passes of 16 rows, then one of the rest (its own tile shape).
  for (int r0 = 0; r0 < n_act; r0 += k_max_rows) {
    const int8_t* c = codes + r0 * cols;
    const float* x = aux + r0 * aux_per_row;
    float* o = out + r0 * out_stride;
    avx512::with_count<1, k_max_rows>(std::min(k_max_rows, n_act - r0), [&]<int M>() {
      if (offset)
        panel_pass_amx<M, true>(panel, cols, c, x, o, out_stride, lanes);
      else
        panel_pass_amx<M, false>(panel, cols, c, x, o, out_stride, lanes);
    });
  }
}

}  // namespace tandem::kernels::cpu
