// Row dot products: one weight row against up to k_max_act_rows activation rows that were
// converted by quantize_activation_row to the weight type's activation_type. Internal to the
// CPU kernels; matmul() is the public entry.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/weight_type.h"

namespace tandem::kernels::cpu {

// Activation rows one kernel call handles; the weight row's blocks are decoded once per call
// and reused for each of them (the prefill tile of matmul).
inline constexpr int k_max_act_rows = 4;

// out[r * out_stride] = dot(weight row w, activation row at act + r * act_stride) for
// r < n_act (1..k_max_act_rows). n is the row length in elements (multiple of the block size).
using vec_dot_fn = void (*)(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out,
                            int64_t out_stride);

struct dot_kernel {
  weight_type act;    // activation block type (activation_type(weights))
  vec_dot_fn scalar;  // reference: integer sums per block, one float multiply-add per block
  vec_dot_fn avx2;    // AVX2+FMA+F16C; only call when the CPU has them
};

// The kernels for a weight type; throws std::invalid_argument for types without kernels.
const dot_kernel& find_dot_kernel(weight_type weights);

// Scalar references (vec_dot_scalar.cpp, vec_dot_scalar_k.cpp).
void vec_dot_f32_scalar(int64_t, const void*, const void*, size_t, int, float*, int64_t);
void vec_dot_f16_scalar(int64_t, const void*, const void*, size_t, int, float*, int64_t);
void vec_dot_bf16_scalar(int64_t, const void*, const void*, size_t, int, float*, int64_t);
void vec_dot_q4_0_scalar(int64_t, const void*, const void*, size_t, int, float*, int64_t);
void vec_dot_q4_1_scalar(int64_t, const void*, const void*, size_t, int, float*, int64_t);
void vec_dot_q5_0_scalar(int64_t, const void*, const void*, size_t, int, float*, int64_t);
void vec_dot_q5_1_scalar(int64_t, const void*, const void*, size_t, int, float*, int64_t);
void vec_dot_q8_0_scalar(int64_t, const void*, const void*, size_t, int, float*, int64_t);
void vec_dot_q4_k_scalar(int64_t, const void*, const void*, size_t, int, float*, int64_t);
void vec_dot_q5_k_scalar(int64_t, const void*, const void*, size_t, int, float*, int64_t);
void vec_dot_q6_k_scalar(int64_t, const void*, const void*, size_t, int, float*, int64_t);

// AVX2 paths (vec_dot_float_avx2.cpp, vec_dot_legacy_avx2.cpp, vec_dot_k_avx2.cpp).
void vec_dot_f32_avx2(int64_t, const void*, const void*, size_t, int, float*, int64_t);
void vec_dot_f16_avx2(int64_t, const void*, const void*, size_t, int, float*, int64_t);
void vec_dot_bf16_avx2(int64_t, const void*, const void*, size_t, int, float*, int64_t);
void vec_dot_q4_0_avx2(int64_t, const void*, const void*, size_t, int, float*, int64_t);
void vec_dot_q4_1_avx2(int64_t, const void*, const void*, size_t, int, float*, int64_t);
void vec_dot_q5_0_avx2(int64_t, const void*, const void*, size_t, int, float*, int64_t);
void vec_dot_q5_1_avx2(int64_t, const void*, const void*, size_t, int, float*, int64_t);
void vec_dot_q8_0_avx2(int64_t, const void*, const void*, size_t, int, float*, int64_t);
void vec_dot_q4_k_avx2(int64_t, const void*, const void*, size_t, int, float*, int64_t);
void vec_dot_q5_k_avx2(int64_t, const void*, const void*, size_t, int, float*, int64_t);
void vec_dot_q6_k_avx2(int64_t, const void*, const void*, size_t, int, float*, int64_t);

}  // namespace tandem::kernels::cpu
