// Internal to the CPU element-wise ops: their AVX2 paths (ops_avx2.cpp), which the public
// functions in ops.h reach through active_isa(). Only call them when the CPU has AVX2, FMA and
// F16C. The avx512 path takes these too (each op is well under 1% of a forward pass), but for
// the ops whose contract is expf itself, which have AVX-512 forms (ops_avx512.cpp) as well as
// AVX2 ones.
#pragma once

#include <cstdint>

namespace tandem::kernels::cpu {

// dst[i] = nearest f16 of src[i], ties to even; the same bits as fp32_to_fp16 for every
// non-NaN input (a NaN stays a NaN, payload aside).
void f32_to_f16_row_avx2(const float* src, uint16_t* dst, int64_t n);

// As rms_norm (same float products and final scaling; the double sum is accumulated in eight
// lanes, an order difference far below float resolution).
void rms_norm_avx2(const float* x, const float* w, float* out, int64_t n, float eps);

// rope_apply's rotation, bit for bit: each output is the same two float products and one sum
// or difference as the scalar loop (no fused multiply-add). `half` pairs per head: (x[2i],
// x[2i+1]) when adjacent, (x[i], x[i + half]) when neox; cs holds cos, sin of pair i at 2i, 2i+1.
void rope_apply_avx2(float* x, int n_heads, int head_dim, int half, bool neox, const float* cs);

// As softmax, with the vector e^x avx2::exp_ps (simd_avx2.h) instead of expf.
void softmax_avx2(float* x, int64_t n);

// As swiglu, with avx2::exp_ps instead of expf (swiglu_fast in ops.h).
void swiglu_avx2(float* gate, const float* up, int64_t n);

// out[i] = e^x[i] through the vector exponential softmax_avx2 uses (avx2::exp_ps); here so
// that tests can measure its error. out may equal x.
void exp_avx2(const float* x, float* out, int64_t n);

// out[i] = expf(x[i]), the same bits as std::exp on floats (avx2::expf_exact,
// avx512::expf_exact); out may equal x. The avx512 form only with AVX-512 (isa::avx512).
void expf_exact_avx2(const float* x, float* out, int64_t n);
void expf_exact_avx512(const float* x, float* out, int64_t n);

// swiglu itself, bit for bit: its expf through avx2::expf_exact / avx512::expf_exact (the
// latter only with AVX-512).
void swiglu_exact_avx2(float* gate, const float* up, int64_t n);
void swiglu_avx512(float* gate, const float* up, int64_t n);

}  // namespace tandem::kernels::cpu
