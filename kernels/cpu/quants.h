// Block layouts of the GGUF weight types and their scalar reference conversions.
#pragma once

#include <cstdint>

#include "kernels/weight_type.h"

namespace tandem::kernels::cpu {

// Scalar reference: dst[0..n) = dequantized src. n is a multiple of the type's block size.
// Supported for every weight_type whose info().computable is true (and F32/F16/BF16).
void dequantize_row(weight_type t, const void* src, float* dst, int64_t n);

// Quantizes n floats into the type's blocks (round-to-nearest with the usual ggml scale
// choices; K-quants search scales per sub-block). Used by `tandem synth` and the tests.
void quantize_row(weight_type t, const float* src, void* dst, int64_t n);

float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);
float bf16_to_fp32(uint16_t h);
uint16_t fp32_to_bf16(float f);  // round to nearest even

}  // namespace tandem::kernels::cpu
