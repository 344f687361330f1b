// Scalar reference dots for float weights and the legacy 32-element quant blocks. Integer
// sums per block, then one float multiply per block in ggml's order of operations, so these
// are the yardstick the SIMD paths are tested against.
#include <cstring>

#include "kernels/cpu/blocks.h"
#include "kernels/cpu/quants.h"
#include "kernels/cpu/vec_dot.h"

namespace tandem::kernels::cpu {
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
void dot_16bit(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out,
               int64_t out_stride) {
  const auto* wb = static_cast<const uint8_t*>(w);
  for_each_row(act, act_stride, n_act, out, out_stride, [&](const uint8_t* a) {
    double sum = 0;
    for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(to_f32(load_u16(wb + 2 * i)) * to_f32(load_u16(a + 2 * i)));
    return static_cast<float>(sum);
  });
}

}  // namespace

void vec_dot_f32_scalar(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out,
                        int64_t out_stride) {
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

void vec_dot_f16_scalar(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out,
                        int64_t out_stride) {
  dot_16bit<fp16_to_fp32>(n, w, act, act_stride, n_act, out, out_stride);
}

void vec_dot_bf16_scalar(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out,
                         int64_t out_stride) {
  dot_16bit<bf16_to_fp32>(n, w, act, act_stride, n_act, out, out_stride);
}

void vec_dot_q4_0_scalar(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out,
                         int64_t out_stride) {
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

void vec_dot_q4_1_scalar(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out,
                         int64_t out_stride) {
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

void vec_dot_q5_0_scalar(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out,
                         int64_t out_stride) {
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

void vec_dot_q5_1_scalar(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out,
                         int64_t out_stride) {
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

void vec_dot_q8_0_scalar(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out,
                         int64_t out_stride) {
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

}  // namespace tandem::kernels::cpu
