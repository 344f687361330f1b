// Per-type quantizers and dequantizers behind quants.h's dispatch (internal to kernels/cpu).
// All take n elements, a multiple of the type's block size.
#pragma once

#include <cstdint>
#include <cstring>

namespace tandem::kernels::cpu {

// Legacy 32-element blocks (quants_legacy.cpp): ggml's reference quantizers.
void quantize_q4_0(const float* x, void* dst, int64_t n);
void quantize_q4_1(const float* x, void* dst, int64_t n);
void quantize_q5_0(const float* x, void* dst, int64_t n);
void quantize_q5_1(const float* x, void* dst, int64_t n);
void quantize_q8_0(const float* x, void* dst, int64_t n);
void dequantize_q4_0(const void* src, float* y, int64_t n);
void dequantize_q4_1(const void* src, float* y, int64_t n);
void dequantize_q5_0(const void* src, float* y, int64_t n);
void dequantize_q5_1(const void* src, float* y, int64_t n);
void dequantize_q8_0(const void* src, float* y, int64_t n);

// K-quant 256-element super-blocks (quants_k.cpp): searched scales, deterministic.
void quantize_q4_k(const float* x, void* dst, int64_t n);
void quantize_q5_k(const float* x, void* dst, int64_t n);
void quantize_q6_k(const float* x, void* dst, int64_t n);
void dequantize_q4_k(const void* src, float* y, int64_t n);
void dequantize_q5_k(const void* src, float* y, int64_t n);
void dequantize_q6_k(const void* src, float* y, int64_t n);

// ggml's nearest_int: round half to even through the float mantissa (|f| < 2^22).
inline int nearest_int(float f) {
  const float v = f + 12582912.0f;  // 1.5 * 2^23: pushes the integer part into the mantissa
  int32_t i;
  std::memcpy(&i, &v, sizeof i);
  return (i & 0x007fffff) - 0x00400000;
}

}  // namespace tandem::kernels::cpu
