// Row dot products: up to k_max_weight_rows weight rows against up to k_max_act_rows
// activation rows that were converted by quantize_activation_row to the weight type's
// activation_type. Internal to the CPU kernels; matmul() is the public entry.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/isa.h"
#include "kernels/weight_type.h"

namespace tandem::kernels::cpu {

// Activation rows one kernel call handles; each weight block is decoded once per call and
// reused for each of them (the prefill tile of matmul).
inline constexpr int k_max_act_rows = 4;
// Weight rows one kernel call handles: independent accumulators that keep the FMA and
// dot-product units busy in decode, and activation loads shared across rows in prefill.
inline constexpr int k_max_weight_rows = 4;

// The single-row form the scalar and AVX2 kernels are written in:
// out[r * out_stride] = dot(weight row w, activation row at act + r * act_stride) for
// r < n_act (1..k_max_act_rows). n is the row length in elements (multiple of the block size).
using vec_dot_fn = void (*)(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out, int64_t out_stride);

// The form matmul calls: a register tile of weight rows x activation rows.
// out[r * out_stride + o] = dot(weight row at w + o * w_stride, activation row at
// act + r * act_stride) for o < n_w (1..k_max_weight_rows), r < n_act (1..k_max_act_rows).
using dot_fn = void (*)(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride, int n_act, float* out,
                        int64_t out_stride);

// A dot_fn that runs a single-row kernel once per weight row.
template <vec_dot_fn F>
void each_weight_row(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride, int n_act, float* out,
                     int64_t out_stride) {
  for (int o = 0; o < n_w; ++o) F(n, static_cast<const unsigned char*>(w) + o * w_stride, act, act_stride, n_act, out + o, out_stride);
}

struct dot_kernel {
  weight_type act;                 // activation block type (activation_type(weights))
  dot_fn scalar;                   // reference: integer sums per block, one float multiply-add per block
  dot_fn avx2;                     // AVX2+FMA+F16C; only call when the CPU has them
  dot_fn avx512;                   // AVX-512 VNNI (and BF16 for BF16 weights); null: the avx2 kernel
  bool avx512_needs_bf16 = false;  // the avx512 kernel uses AVX-512 BF16 instructions
};

// The kernels for a weight type; throws std::invalid_argument for types without kernels.
const dot_kernel& find_dot_kernel(weight_type weights);

// The kernel of `k` for an ISA path (scalar, avx2 or avx512; never best), falling back to the
// next narrower path where a wider one has no kernel or the CPU lacks an extension it uses.
dot_fn select_dot(const dot_kernel& k, isa path);

// Scalar references (vec_dot.cpp).
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

// AVX2 paths (vec_dot_avx2.cpp).
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

// AVX2 tiles of the 32-element block types (vec_dot_avx2.cpp), dot_fn form; the
// vec_dot_*_avx2 above are their one-row case.
void dot_q4_0_avx2(int64_t, const void*, size_t, int, const void*, size_t, int, float*, int64_t);
void dot_q4_1_avx2(int64_t, const void*, size_t, int, const void*, size_t, int, float*, int64_t);
void dot_q5_0_avx2(int64_t, const void*, size_t, int, const void*, size_t, int, float*, int64_t);
void dot_q5_1_avx2(int64_t, const void*, size_t, int, const void*, size_t, int, float*, int64_t);
void dot_q8_0_avx2(int64_t, const void*, size_t, int, const void*, size_t, int, float*, int64_t);

// AVX-512 tiles (vec_dot_avx512.cpp), dot_fn form.
#define TANDEM_DOT_FN(name) \
  void name(int64_t n, const void* w, size_t w_stride, int n_w, const void* act, size_t act_stride, int n_act, float* out, int64_t out_stride)
TANDEM_DOT_FN(dot_f32_avx512);
TANDEM_DOT_FN(dot_f16_avx512);
TANDEM_DOT_FN(dot_bf16_avx512);
TANDEM_DOT_FN(dot_q4_0_avx512);
TANDEM_DOT_FN(dot_q4_1_avx512);
TANDEM_DOT_FN(dot_q5_0_avx512);
TANDEM_DOT_FN(dot_q5_1_avx512);
TANDEM_DOT_FN(dot_q8_0_avx512);
TANDEM_DOT_FN(dot_q4_k_avx512);
TANDEM_DOT_FN(dot_q5_k_avx512);
TANDEM_DOT_FN(dot_q6_k_avx512);
#undef TANDEM_DOT_FN

}  // namespace tandem::kernels::cpu
