// Block layouts of the GGUF weight types and their scalar reference conversions.
#pragma once

#include <cstdint>
#include <cstring>

#include "kernels/weight_type.h"

namespace tandem::kernels::cpu {

// Scalar reference: dst[0..n) = dequantized src. n is a multiple of the type's block size.
// Supported for every weight_type whose info().computable is true (and F32/F16/BF16).
void dequantize_row(weight_type t, const void* src, float* dst, int64_t n);

// Quantizes n floats into the type's blocks. Q4_0/Q4_1/Q5_0/Q5_1/Q8_0 follow ggml's
// reference quantizers formula for formula (byte-identical output); Q4_K/Q5_K/Q6_K use
// tandem's own deterministic least-squares search over sub-block scales (and mins), not
// bit-identical to llama-quantize. F32/F16/BF16 convert (round to nearest even). Used by
// `tandem synth` and the tests. Both functions throw std::invalid_argument naming the type
// when it has no CPU support or n is not a multiple of its block size. Blocks need no
// particular alignment.
void quantize_row(weight_type t, const float* src, void* dst, int64_t n);

// IEEE binary16 <-> binary32: round to nearest even, subnormals kept, overflow to infinity,
// NaN stays NaN (matches F16C vcvtps2ph, rounding mode 0, except for NaN payloads).
float fp16_to_fp32(uint16_t h);
uint16_t fp32_to_fp16(float f);
float bf16_to_fp32(uint16_t h);
uint16_t fp32_to_bf16(float f);  // round to nearest even

// ggml's nearest_int: round half to even through the float mantissa (|f| < 2^22). Shared by
// the K-quant quantizers and the activation quantizers (act_quant.h).
inline int nearest_int(float f) {
  const float v = f + 12582912.0f;  // 1.5 * 2^23: pushes the integer part into the mantissa
  int32_t i;
  std::memcpy(&i, &v, sizeof i);
  return (i & 0x007fffff) - 0x00400000;
}

}  // namespace tandem::kernels::cpu
