// Activation rows converted to the block type a weight type's dot product consumes (ggml's
// "vec_dot_type"), so integer dots run on both sides and results track llama.cpp's CPU path.
#pragma once

#include <cstdint>

#include "kernels/weight_type.h"

namespace tandem::kernels::cpu {

// Q8_0 for Q4_0 / Q5_0 / Q8_0, Q8_1 for Q4_1 / Q5_1, Q8_K for Q4_K / Q5_K / Q6_K, F16 for F16,
// BF16 for BF16, F32 for F32. Throws std::invalid_argument for weight types without kernels.
weight_type activation_type(weight_type weights);

// Converts n floats (a multiple of the block size of `act`) into dst, row_bytes(act, n) bytes.
// act is one of Q8_0, Q8_1, Q8_K, F16, BF16, F32. Formulas are those llama.cpp's x86 build
// runs: Q8_0/Q8_1: d = amax/127, q = nearest-even(x * (127/amax)), Q8_1 s = d * sum(q);
// Q8_K: d = max/-127 with the signed absolute maximum, q = nearest-even, bsums per 16.
// dst needs no particular alignment except for Q8_K (4 bytes, for its float d).
void quantize_activation_row(weight_type act, const float* src, void* dst, int64_t n);

// Inverse of quantize_activation_row (for tests and diagnostics).
void dequantize_activation_row(weight_type act, const void* src, float* dst, int64_t n);

// The ISA forms behind quantize_activation_row, internal to kernels/cpu: only call them where
// the CPU has the instruction set.

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
void panel_act_row_avx512(weight_type act, int sub, int offset, const float* x, int64_t cols, int8_t* codes, float* aux, int64_t code_stride,
                          int64_t aux_stride);
// act_quant_avx2.cpp: the same, for the AVX2 path.
void quantize_q8_0_act_avx2(const float* x, void* dst, int64_t n);
void quantize_q8_1_avx2(const float* x, void* dst, int64_t n);
void quantize_q8_k_avx2(const float* x, void* dst, int64_t n);

}  // namespace tandem::kernels::cpu
