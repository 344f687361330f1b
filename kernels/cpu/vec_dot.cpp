// Row dot products (vec_dot.h): the table of kernels per weight type and path, and the scalar
// references every SIMD tile is tested against.
#include "kernels/cpu/vec_dot.h"

#include <array>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cpu/blocks.h"
#include "kernels/cpu/quants.h"

namespace tandem::kernels::cpu {
namespace {

struct entry {
  weight_type weights;
  dot_kernel kernel;
};

#define TANDEM_ROWS(f) each_weight_row<f>

// One row per weight type with kernels; the activation column mirrors activation_type().
// An avx512 column of nullptr falls back to the avx2 kernel.
const std::array<entry, 11> k_kernels{{
    {weight_type::f32, {weight_type::f32, TANDEM_ROWS(vec_dot_f32_scalar), TANDEM_ROWS(vec_dot_f32_avx2), dot_f32_avx512}},
    {weight_type::f16, {weight_type::f16, TANDEM_ROWS(vec_dot_f16_scalar), TANDEM_ROWS(vec_dot_f16_avx2), dot_f16_avx512}},
    {weight_type::bf16, {weight_type::bf16, TANDEM_ROWS(vec_dot_bf16_scalar), TANDEM_ROWS(vec_dot_bf16_avx2), dot_bf16_avx512, true}},
    {weight_type::q4_0, {weight_type::q8_0, TANDEM_ROWS(vec_dot_q4_0_scalar), dot_q4_0_avx2, dot_q4_0_avx512}},
    {weight_type::q4_1, {weight_type::q8_1, TANDEM_ROWS(vec_dot_q4_1_scalar), dot_q4_1_avx2, dot_q4_1_avx512}},
    {weight_type::q5_0, {weight_type::q8_0, TANDEM_ROWS(vec_dot_q5_0_scalar), dot_q5_0_avx2, dot_q5_0_avx512}},
    {weight_type::q5_1, {weight_type::q8_1, TANDEM_ROWS(vec_dot_q5_1_scalar), dot_q5_1_avx2, dot_q5_1_avx512}},
    {weight_type::q8_0, {weight_type::q8_0, TANDEM_ROWS(vec_dot_q8_0_scalar), dot_q8_0_avx2, dot_q8_0_avx512}},
    {weight_type::q4_k, {weight_type::q8_k, TANDEM_ROWS(vec_dot_q4_k_scalar), TANDEM_ROWS(vec_dot_q4_k_avx2), dot_q4_k_avx512}},
    {weight_type::q5_k, {weight_type::q8_k, TANDEM_ROWS(vec_dot_q5_k_scalar), TANDEM_ROWS(vec_dot_q5_k_avx2), dot_q5_k_avx512}},
    {weight_type::q6_k, {weight_type::q8_k, TANDEM_ROWS(vec_dot_q6_k_scalar), TANDEM_ROWS(vec_dot_q6_k_avx2), dot_q6_k_avx512}},
}};

#undef TANDEM_ROWS

}  // namespace

const dot_kernel& find_dot_kernel(weight_type weights) {
  for (const auto& e : k_kernels)
    if (e.weights == weights) return e.kernel;
  std::string supported;
  for (const auto& e : k_kernels) supported += (supported.empty() ? "" : ", ") + display_name(e.weights);
  throw std::invalid_argument("no CPU dot product for weight type " + display_name(weights) + " (supported: " + supported + ")");
}

dot_fn select_dot(const dot_kernel& k, isa path) {
  if (path == isa::avx512 && k.avx512 && (!k.avx512_needs_bf16 || cpu_has_avx512_bf16())) return k.avx512;
  if (path == isa::avx512 || path == isa::avx2) return k.avx2;
  return k.scalar;
}

// Scalar reference dots for float weights and the legacy 32-element quant blocks. Integer
// sums per block, then one float multiply per block in ggml's order of operations, so these
// are the yardstick the SIMD paths are tested against.
namespace {

constexpr int qk = k_qk_legacy;

inline uint16_t load_u16(const uint8_t* p) {
  uint16_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline uint32_t load_qh(const uint8_t* qh) {
  uint32_t v;
  std::memcpy(&v, qh, sizeof v);
  return v;
}

// Runs `one(w, act_row)` for each activation row.
template <class F>
void for_each_row(const void* act, size_t act_stride, int n_act, float* out, int64_t out_stride, F one) {
  const auto* a = static_cast<const uint8_t*>(act);
  for (int r = 0; r < n_act; ++r) out[r * out_stride] = one(a + r * act_stride);
}

// 16-bit float formats: the products are rounded to float and summed in double, as ggml does.
template <float (*to_f32)(uint16_t)>
void dot_16bit(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out, int64_t out_stride) {
  const auto* wb = static_cast<const uint8_t*>(w);
  for_each_row(act, act_stride, n_act, out, out_stride, [&](const uint8_t* a) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(to_f32(load_u16(wb + 2 * i)) * to_f32(load_u16(a + 2 * i)));
    return static_cast<float>(sum);
  });
}

}  // namespace

void vec_dot_f32_scalar(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out, int64_t out_stride) {
  // Weights through memcpy: an F32 tensor inside a file need not be float-aligned.
  const auto* wb = static_cast<const uint8_t*>(w);
  for_each_row(act, act_stride, n_act, out, out_stride, [&](const uint8_t* a) {
    const auto* af = reinterpret_cast<const float*>(a);
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) {
      float wi;
      std::memcpy(&wi, wb + 4 * i, sizeof wi);
      sum += static_cast<double>(wi * af[i]);
    }
    return static_cast<float>(sum);
  });
}

void vec_dot_f16_scalar(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out, int64_t out_stride) {
  dot_16bit<fp16_to_fp32>(n, w, act, act_stride, n_act, out, out_stride);
}

void vec_dot_bf16_scalar(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out, int64_t out_stride) {
  dot_16bit<bf16_to_fp32>(n, w, act, act_stride, n_act, out, out_stride);
}

void vec_dot_q4_0_scalar(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out, int64_t out_stride) {
  const auto* x = static_cast<const block_q4_0*>(w);
  for_each_row(act, act_stride, n_act, out, out_stride, [&](const uint8_t* a) {
    const auto* y = reinterpret_cast<const block_q8_0*>(a);
    float sum = 0;
    for (int64_t b = 0; b < n / qk; ++b) {
      int sumi = 0;
      for (int j = 0; j < qk / 2; ++j) {
        sumi += ((x[b].qs[j] & 0xF) - 8) * y[b].qs[j];
        sumi += ((x[b].qs[j] >> 4) - 8) * y[b].qs[j + qk / 2];
      }
      sum += static_cast<float>(sumi) * fp16_to_fp32(load_half(x[b].d)) * fp16_to_fp32(load_half(y[b].d));
    }
    return sum;
  });
}

void vec_dot_q4_1_scalar(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out, int64_t out_stride) {
  const auto* x = static_cast<const block_q4_1*>(w);
  for_each_row(act, act_stride, n_act, out, out_stride, [&](const uint8_t* a) {
    const auto* y = reinterpret_cast<const block_q8_1*>(a);
    float sum = 0;
    for (int64_t b = 0; b < n / qk; ++b) {
      int sumi = 0;
      for (int j = 0; j < qk / 2; ++j) {
        sumi += (x[b].qs[j] & 0xF) * y[b].qs[j];
        sumi += (x[b].qs[j] >> 4) * y[b].qs[j + qk / 2];
      }
      // The weight offset m meets the activation sum s = d * sum(q): m * sum(x) in one term.
      sum += fp16_to_fp32(load_half(x[b].d)) * fp16_to_fp32(load_half(y[b].d)) * static_cast<float>(sumi) +
             fp16_to_fp32(load_half(x[b].m)) * fp16_to_fp32(load_half(y[b].s));
    }
    return sum;
  });
}

void vec_dot_q5_0_scalar(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out, int64_t out_stride) {
  const auto* x = static_cast<const block_q5_0*>(w);
  for_each_row(act, act_stride, n_act, out, out_stride, [&](const uint8_t* a) {
    const auto* y = reinterpret_cast<const block_q8_0*>(a);
    float sum = 0;
    for (int64_t b = 0; b < n / qk; ++b) {
      const uint32_t qh = load_qh(x[b].qh);
      int sumi = 0;
      for (int j = 0; j < qk / 2; ++j) {
        const int lo = ((x[b].qs[j] & 0xF) | static_cast<int>(((qh >> j) & 1) << 4)) - 16;
        const int hi = ((x[b].qs[j] >> 4) | static_cast<int>(((qh >> (j + qk / 2)) & 1) << 4)) - 16;
        sumi += lo * y[b].qs[j] + hi * y[b].qs[j + qk / 2];
      }
      sum += static_cast<float>(sumi) * fp16_to_fp32(load_half(x[b].d)) * fp16_to_fp32(load_half(y[b].d));
    }
    return sum;
  });
}

void vec_dot_q5_1_scalar(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out, int64_t out_stride) {
  const auto* x = static_cast<const block_q5_1*>(w);
  for_each_row(act, act_stride, n_act, out, out_stride, [&](const uint8_t* a) {
    const auto* y = reinterpret_cast<const block_q8_1*>(a);
    float sum = 0;
    for (int64_t b = 0; b < n / qk; ++b) {
      const uint32_t qh = load_qh(x[b].qh);
      int sumi = 0;
      for (int j = 0; j < qk / 2; ++j) {
        const int lo = (x[b].qs[j] & 0xF) | static_cast<int>(((qh >> j) & 1) << 4);
        const int hi = (x[b].qs[j] >> 4) | static_cast<int>(((qh >> (j + qk / 2)) & 1) << 4);
        sumi += lo * y[b].qs[j] + hi * y[b].qs[j + qk / 2];
      }
      sum += fp16_to_fp32(load_half(x[b].d)) * fp16_to_fp32(load_half(y[b].d)) * static_cast<float>(sumi) +
             fp16_to_fp32(load_half(x[b].m)) * fp16_to_fp32(load_half(y[b].s));
    }
    return sum;
  });
}

void vec_dot_q8_0_scalar(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out, int64_t out_stride) {
  const auto* x = static_cast<const block_q8_0*>(w);
  for_each_row(act, act_stride, n_act, out, out_stride, [&](const uint8_t* a) {
    const auto* y = reinterpret_cast<const block_q8_0*>(a);
    float sum = 0;
    for (int64_t b = 0; b < n / qk; ++b) {
      int sumi = 0;
      for (int j = 0; j < qk; ++j) sumi += x[b].qs[j] * y[b].qs[j];
      sum += static_cast<float>(sumi) * (fp16_to_fp32(load_half(x[b].d)) * fp16_to_fp32(load_half(y[b].d)));
    }
    return sum;
  });
}

// Scalar reference dots for the K-quants against Q8_K activations. Per super-block the
// scaled code products and the min terms are summed exactly in integers; the mins use the
// activation's bsums (sums of 16 codes), which is also how the SIMD paths fold them.
namespace {

template <class F>
void for_each_q8k_row(const void* act, size_t act_stride, int n_act, float* out, int64_t out_stride, F one) {
  const auto* a = static_cast<const uint8_t*>(act);
  for (int r = 0; r < n_act; ++r) out[r * out_stride] = one(reinterpret_cast<const block_q8_k*>(a + r * act_stride));
}

// Q4_K and Q5_K share everything but where the code's fifth bit comes from.
template <bool five_bit, class Block>
float dot_k_affine(int64_t n, const Block* x, const block_q8_k* y) {
  float sum = 0;
  for (int64_t b = 0; b < n / k_qk_k; ++b) {
    uint8_t sc[8], m[8];
    unpack_k_scales(x[b].scales, sc, m);
    int isum = 0, imin = 0;
    for (int c = 0; c < 4; ++c) {
      int dot_lo = 0, dot_hi = 0;
      for (int l = 0; l < 32; ++l) {
        int lo = x[b].qs[32 * c + l] & 0xF;
        int hi = x[b].qs[32 * c + l] >> 4;
        if constexpr (five_bit) {
          lo |= ((x[b].qh[l] >> (2 * c)) & 1) << 4;
          hi |= ((x[b].qh[l] >> (2 * c + 1)) & 1) << 4;
        }
        dot_lo += lo * y[b].qs[64 * c + l];
        dot_hi += hi * y[b].qs[64 * c + 32 + l];
      }
      isum += sc[2 * c] * dot_lo + sc[2 * c + 1] * dot_hi;
    }
    for (int j = 0; j < 8; ++j) imin += m[j] * (y[b].bsums[2 * j] + y[b].bsums[2 * j + 1]);
    const float d = fp16_to_fp32(load_half(x[b].d)) * y[b].d;
    const float dmin = fp16_to_fp32(load_half(x[b].dmin)) * y[b].d;
    sum += d * static_cast<float>(isum) - dmin * static_cast<float>(imin);
  }
  return sum;
}

}  // namespace

void vec_dot_q4_k_scalar(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out, int64_t out_stride) {
  const auto* x = static_cast<const block_q4_k*>(w);
  for_each_q8k_row(act, act_stride, n_act, out, out_stride, [&](const block_q8_k* y) { return dot_k_affine<false>(n, x, y); });
}

void vec_dot_q5_k_scalar(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out, int64_t out_stride) {
  const auto* x = static_cast<const block_q5_k*>(w);
  for_each_q8k_row(act, act_stride, n_act, out, out_stride, [&](const block_q8_k* y) { return dot_k_affine<true>(n, x, y); });
}

void vec_dot_q6_k_scalar(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out, int64_t out_stride) {
  const auto* x = static_cast<const block_q6_k*>(w);
  for_each_q8k_row(act, act_stride, n_act, out, out_stride, [&](const block_q8_k* y) {
    float sum = 0;
    for (int64_t b = 0; b < n / k_qk_k; ++b) {
      int isum = 0;
      for (int h = 0; h < 2; ++h) {
        const uint8_t* ql = x[b].ql + 64 * h;
        const uint8_t* qh = x[b].qh + 32 * h;
        const int8_t* sc = x[b].scales + 8 * h;
        const int8_t* q8 = y[b].qs + 128 * h;
        int part[8] = {};  // per 16-element sub-block of this half
        for (int l = 0; l < 32; ++l) {
          const int is = l / 16;
          int q[4];
          unpack_q6_k_codes(ql, qh, l, q);
          for (int k = 0; k < 4; ++k) part[is + 2 * k] += q[k] * q8[l + 32 * k];
        }
        for (int s = 0; s < 8; ++s) isum += sc[s] * part[s];
      }
      sum += fp16_to_fp32(load_half(x[b].d)) * y[b].d * static_cast<float>(isum);
    }
    return sum;
  });
}

}  // namespace tandem::kernels::cpu
