// The ISA-specific activation quantizers behind quantize_activation_row (internal).
#pragma once

#include <cstdint>

namespace tandem::kernels::cpu {

// act_quant_avx512.cpp: byte for byte the scalar quantizers of act_quant.cpp.
void quantize_q8_0_act_avx512(const float* x, void* dst, int64_t n);
void quantize_q8_1_avx512(const float* x, void* dst, int64_t n);
void quantize_q8_k_avx512(const float* x, void* dst, int64_t n);
// act_quant_avx2.cpp: the same, for the AVX2 path.
void quantize_q8_0_act_avx2(const float* x, void* dst, int64_t n);
void quantize_q8_1_avx2(const float* x, void* dst, int64_t n);
void quantize_q8_k_avx2(const float* x, void* dst, int64_t n);

}  // namespace tandem::kernels::cpu
