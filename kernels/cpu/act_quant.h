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

}  // namespace tandem::kernels::cpu
