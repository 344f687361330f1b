// The ISA-specific activation quantizers behind quantize_activation_row (internal).
#pragma once

#include <cstdint>

#include "kernels/weight_type.h"

namespace tandem::kernels::cpu {

// act_quant_avx512.cpp: byte for byte the scalar quantizers of act_quant.cpp.
void quantize_q8_0_act_avx512(const float* x, void* dst, int64_t n);
void quantize_q8_1_avx512(const float* x, void* dst, int64_t n);
void quantize_q8_k_avx512(const float* x, void* dst, int64_t n);
// One row straight into its panel form (panel.h: codes, and per sub-block {da, ds, offset *
// sum}), byte for byte quantize_activation_row into `act` followed by panel_acts for a weight
// type with sub-blocks of `sub` and code offset `offset` (panel_act_row, panel.cpp). The codes
// of columns [32c, 32c + 32) go to codes + c * code_stride and the aux floats of sub-block s to
// aux + s * aux_stride: 32 and k_panel_aux_per_sub for the row's own form, a group's for the
// tiled form (tiled_act_row, panel.cpp).
void panel_act_row_avx512(weight_type act, int sub, int offset, const float* x, int64_t cols, int8_t* codes, float* aux,
                          int64_t code_stride, int64_t aux_stride);
// act_quant_avx2.cpp: the same, for the AVX2 path.
void quantize_q8_0_act_avx2(const float* x, void* dst, int64_t n);
void quantize_q8_1_avx2(const float* x, void* dst, int64_t n);
void quantize_q8_k_avx2(const float* x, void* dst, int64_t n);

}  // namespace tandem::kernels::cpu
