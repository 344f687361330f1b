// Packed weight panels for the many-row products (prefill, batched decode) on AVX-512 VNNI.
//
// The row-tile kernels of vec_dot.h keep each output's partial sums in the lanes of its own
// register, so every 32-element block costs one int->float conversion and one FMA per
// (weight row, activation row) pair. A panel instead puts 16 weight rows side by side, one
// per int32 lane: each vpdpbusd then multiplies 4 codes of 16 rows by the same 4 activation
// bytes (a broadcast), a block's integer dots for all 16 rows finish in one register, and
// its scales cost one conversion and a few FMAs per 16 outputs. The price is decoding the
// weights into that layout, paid once per panel and shared by every activation row, so it
// only pays from a few activation rows on (panel_min_act_rows).
//
// Every quantized type fits one form: a weight is scale * code + min per sub-block of S
// elements (S = 32, or 16 for Q6_K), with an unsigned code (Q8_0: q + 128, Q4_0: q, Q6_K: q,
// min = -128 d, -8 d, -32 d sc). With activations as int8 a, scale da and sum per sub-block:
//   out = sum over sub-blocks of (scale * da) * (codes . a) + min * (da * sum a)
// The integer dots are exact; results differ from the row-tile kernels only in float rounding
// (as llama.cpp's repacked kernels differ from its plain ones), except for Q4_1 / Q5_1: their
// panel kernel keeps ggml's x86 float order and equals the row tiles bit for bit, because
// llama.cpp has no repacked form of them and the SmolLM2 fixtures sit on near-ties.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/weight_type.h"

namespace tandem::kernels::cpu {

inline constexpr int k_panel_rows = 16;  // weight rows per panel: the int32 lanes of a zmm
// Activation rows from which matmul uses panels; below, packing costs more than it saves.
// Measured crossovers against the row tiles (weights from DRAM, 2 threads, 2816 x 1024):
// about 4 rows for Q4_0, 6 for Q8_0 and Q4_K, 8 for Q6_K, whose scales cost more to pack,
// and 8-10 for Q4_1/Q5_1, whose kernel keeps ggml's float order (see panel_avx512.cpp).
int64_t panel_min_act_rows(weight_type wt);
// Activation rows one kernel call carries (its int and float accumulators fill the registers).
inline constexpr int k_panel_max_act_rows = 8;

// Whether `wt` has a panel form (the quantized types).
bool panel_supported(weight_type wt);
// Elements per sub-block (16 or 32); 0 for unsupported types.
int panel_sub_elems(weight_type wt);

// Panel layout for `cols` columns: per sub-block, sub/4 groups of 64 code bytes (byte 4r+i of
// group g = code of row r, column 4g+i of the sub-block), then 16 float scales, 16 float mins.
size_t panel_bytes(weight_type wt, int64_t cols);

// Activation rows as the panel kernel reads them: int8 codes, `cols` per row, and per row and
// sub-block k_panel_aux_per_sub floats {da, da * sum, offset term}: the third holds the bits of
// an int32, panel_code_offset(wt) * sum. A kernel that starts its integer dot from it sums
// code * a + offset * a = the signed values' dot exactly, as ggml does, instead of adding
// min * da * sum in float. Sizes for n_x rows:
inline constexpr int k_panel_aux_per_sub = 3;
// What the unsigned panel codes of `wt` carry above the signed values they stand for, negated:
// -8 (Q4_0), -16 (Q5_0), -128 (Q8_0), -32 (Q6_K); 0 for types with a separate min (Q4_1, Q5_1,
// Q4_K, Q5_K).
int panel_code_offset(weight_type wt);
size_t panel_act_code_bytes(int64_t cols, int64_t n_x);
size_t panel_act_aux_floats(weight_type wt, int64_t cols, int64_t n_x);
// The offset term of one sub-block's aux floats, and 4 activation codes as one int32 (what the
// integer dots broadcast). static: each kernel file compiles its own copy for its own
// instruction set, so no wide-ISA copy can stand in for baseline code's.
static inline int32_t panel_offset_term(const float* aux_sub) {
  int32_t v;
  std::memcpy(&v, aux_sub + 2, sizeof v);
  return v;
}
static inline int32_t panel_act4(const int8_t* codes) {
  int32_t a;
  std::memcpy(&a, codes, sizeof a);
  return a;
}

// One weight row as codes (cols bytes), scales and mins (one per sub-block): the decoding
// both packers share (panel.cpp).
void panel_decode_row(weight_type wt, const void* row, int64_t cols, uint8_t* codes, float* scale, float* min);

// Portable reference forms (panel.cpp). pack_panel_ref decodes n_rows (1..16) weight rows,
// w_row bytes apart, into `panel`; missing rows are zero (their outputs come out 0).
void pack_panel_ref(weight_type wt, const void* w, size_t w_row, int n_rows, int64_t cols, uint8_t* panel);
// act: n_x rows converted by quantize_activation_row to activation_type(wt), a_row bytes apart.
void panel_acts(weight_type wt, const void* act, size_t a_row, int64_t n_x, int64_t cols, int8_t* codes, float* aux);
// One f32 row straight into its panel form: panel_acts of quantize_activation_row's row, byte
// for byte, in one pass where the CPU has AVX-512 (the two passes otherwise). cols: a multiple
// of activation_type(wt)'s block; throws std::invalid_argument otherwise or for a type without
// a panel form.
void panel_act_row(weight_type wt, const float* x, int64_t cols, int8_t* codes, float* aux);
// panel_act_row's row written straight into row r of a group of n_group rows in the tiled form
// (packed.h, tile_packed_act_row), byte for byte panel_act_row followed by tile_packed_act_row:
// one pass on AVX-512 instead of a pass and a copy (8 rows of 2,816 columns: the copy took 1.5 µs
// beside the conversion's 3.7-6.0). Throws as panel_act_row does.
void tiled_act_row(weight_type wt, const float* x, int64_t cols, int r, int n_group, int8_t* tiled_codes, float* tiled_aux);
// out[r * out_stride + o] for r < n_act, o < n_w from a packed panel.
void panel_dot_ref(weight_type wt, const uint8_t* panel, int64_t cols, const int8_t* codes, const float* aux, int n_act, float* out,
                   int64_t out_stride, int n_w);

// AVX-512 VNNI forms (panel_avx512.cpp); same contracts, n_act <= k_panel_max_act_rows, and
// `panel` 64-byte aligned (aligned vector loads and stores). pack_panel_avx512 gives the same
// bytes as pack_panel_ref and reads nothing outside the n_rows rows.
void pack_panel_avx512(weight_type wt, const void* w, size_t w_row, int n_rows, int64_t cols, uint8_t* panel);
void panel_dot_avx512(weight_type wt, const uint8_t* panel, int64_t cols, const int8_t* codes, const float* aux, int n_act, float* out,
                      int64_t out_stride, int n_w);

// AMX form (panel_amx_avx512.cpp), for the types panel_amx_supported names (Q4_0, Q5_0, Q8_0,
// Q4_K, Q5_K: not Q4_1 and Q5_1, whose panel kernel keeps ggml's float order, nor Q6_K, which
// measured no faster on the tiles); only call where amx_active()
// (isa.h). panel_sign_codes first takes the code offset out of a panel in place (types with
// panel_code_offset; the codes become the signed values, as int8), which panel_dot_amx needs;
// panel_dot_amx then gives panel_dot_avx512's bits over the unsigned panel, for any n_act, 16
// activation rows a pass on the tile unit. Over an expanded Q4_1 or Q5_1 panel it gives the
// packed tile kernel's order instead (packed.h, sum_order::tile: the same epilogue, scale FMA
// then min FMA per sub-block), which matmul uses for packed products of that order.
bool panel_amx_supported(weight_type wt);
void panel_sign_codes(weight_type wt, uint8_t* panel, int64_t cols);
void panel_dot_amx(weight_type wt, const uint8_t* panel, int64_t cols, const int8_t* codes, const float* aux, int n_act, float* out,
                   int64_t out_stride, int n_w);

}  // namespace tandem::kernels::cpu
