// Legacy 32-element quant blocks. The quantizers follow ggml's *_ref functions formula for
// formula (scale from the signed absolute maximum, truncation after a +0.5 bias), so models
// synthesized here quantize like models made by llama.cpp's tools.
#include "kernels/cpu/quants_impl.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "kernels/cpu/blocks.h"
#include "kernels/cpu/quants.h"

namespace tandem::kernels::cpu {
namespace {

constexpr int qk = k_qk_legacy;

// The value of largest magnitude, with its sign (ties keep the first).
float signed_absmax(const float* x) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < qk; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

void min_max(const float* x, float& mn, float& mx) {
  mn = FLT_MAX;
  mx = -FLT_MAX;
  for (int j = 0; j < qk; ++j) {
    mn = std::min(mn, x[j]);
    mx = std::max(mx, x[j]);
  }
}

// ggml truncates toward zero after adding the bias; the clamp only guards the top code.
inline uint8_t trunc_code(float v, int top) { return static_cast<uint8_t>(std::min(top, static_cast<int>(v))); }

uint32_t load_qh(const uint8_t* qh) {
  uint32_t v;
  std::memcpy(&v, qh, sizeof v);
  return v;
}

}  // namespace

void quantize_q4_0(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<block_q4_0*>(dst);
  for (int64_t i = 0; i < n / qk; ++i, x += qk) {
    // The extreme value maps to code 0 (-8), the end of the range with one more step.
    const float d = signed_absmax(x) / -8;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_half(y[i].d, fp32_to_fp16(d));
    for (int j = 0; j < qk / 2; ++j) {
      const uint8_t lo = trunc_code(x[j] * id + 8.5f, 15);
      const uint8_t hi = trunc_code(x[j + qk / 2] * id + 8.5f, 15);
      y[i].qs[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

void quantize_q4_1(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<block_q4_1*>(dst);
  for (int64_t i = 0; i < n / qk; ++i, x += qk) {
    float mn, mx;
    min_max(x, mn, mx);
    const float d = (mx - mn) / 15;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_half(y[i].d, fp32_to_fp16(d));
    store_half(y[i].m, fp32_to_fp16(mn));
    for (int j = 0; j < qk / 2; ++j) {
      const uint8_t lo = trunc_code((x[j] - mn) * id + 0.5f, 15);
      const uint8_t hi = trunc_code((x[j + qk / 2] - mn) * id + 0.5f, 15);
      y[i].qs[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

void quantize_q5_0(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<block_q5_0*>(dst);
  for (int64_t i = 0; i < n / qk; ++i, x += qk) {
    const float d = signed_absmax(x) / -16;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_half(y[i].d, fp32_to_fp16(d));
    uint32_t qh = 0;
    for (int j = 0; j < qk / 2; ++j) {
      const uint8_t lo = trunc_code(x[j] * id + 16.5f, 31);
      const uint8_t hi = trunc_code(x[j + qk / 2] * id + 16.5f, 31);
      y[i].qs[j] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
      qh |= static_cast<uint32_t>(lo >> 4) << j;
      qh |= static_cast<uint32_t>(hi >> 4) << (j + qk / 2);
    }
    std::memcpy(y[i].qh, &qh, sizeof qh);
  }
}

void quantize_q5_1(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<block_q5_1*>(dst);
  for (int64_t i = 0; i < n / qk; ++i, x += qk) {
    float mn, mx;
    min_max(x, mn, mx);
    const float d = (mx - mn) / 31;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_half(y[i].d, fp32_to_fp16(d));
    store_half(y[i].m, fp32_to_fp16(mn));
    uint32_t qh = 0;
    for (int j = 0; j < qk / 2; ++j) {
      const uint8_t lo = trunc_code((x[j] - mn) * id + 0.5f, 31);
      const uint8_t hi = trunc_code((x[j + qk / 2] - mn) * id + 0.5f, 31);
      y[i].qs[j] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
      qh |= static_cast<uint32_t>(lo >> 4) << j;
      qh |= static_cast<uint32_t>(hi >> 4) << (j + qk / 2);
    }
    std::memcpy(y[i].qh, &qh, sizeof qh);
  }
}

void quantize_q8_0(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<block_q8_0*>(dst);
  for (int64_t i = 0; i < n / qk; ++i, x += qk) {
    float amax = 0.0f;
    for (int j = 0; j < qk; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_half(y[i].d, fp32_to_fp16(d));
    for (int j = 0; j < qk; ++j) y[i].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
  }
}

void dequantize_q4_0(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const block_q4_0*>(src);
  for (int64_t i = 0; i < n / qk; ++i, y += qk) {
    const float d = fp16_to_fp32(load_half(b[i].d));
    for (int j = 0; j < qk / 2; ++j) {
      y[j] = static_cast<float>((b[i].qs[j] & 0xF) - 8) * d;
      y[j + qk / 2] = static_cast<float>((b[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void dequantize_q4_1(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const block_q4_1*>(src);
  for (int64_t i = 0; i < n / qk; ++i, y += qk) {
    const float d = fp16_to_fp32(load_half(b[i].d));
    const float m = fp16_to_fp32(load_half(b[i].m));
    for (int j = 0; j < qk / 2; ++j) {
      y[j] = static_cast<float>(b[i].qs[j] & 0xF) * d + m;
      y[j + qk / 2] = static_cast<float>(b[i].qs[j] >> 4) * d + m;
    }
  }
}

void dequantize_q5_0(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const block_q5_0*>(src);
  for (int64_t i = 0; i < n / qk; ++i, y += qk) {
    const float d = fp16_to_fp32(load_half(b[i].d));
    const uint32_t qh = load_qh(b[i].qh);
    for (int j = 0; j < qk / 2; ++j) {
      const int lo = (b[i].qs[j] & 0xF) | static_cast<int>(((qh >> j) & 1) << 4);
      const int hi = (b[i].qs[j] >> 4) | static_cast<int>(((qh >> (j + qk / 2)) & 1) << 4);
      y[j] = static_cast<float>(lo - 16) * d;
      y[j + qk / 2] = static_cast<float>(hi - 16) * d;
    }
  }
}

void dequantize_q5_1(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const block_q5_1*>(src);
  for (int64_t i = 0; i < n / qk; ++i, y += qk) {
    const float d = fp16_to_fp32(load_half(b[i].d));
    const float m = fp16_to_fp32(load_half(b[i].m));
    const uint32_t qh = load_qh(b[i].qh);
    for (int j = 0; j < qk / 2; ++j) {
      const int lo = (b[i].qs[j] & 0xF) | static_cast<int>(((qh >> j) & 1) << 4);
      const int hi = (b[i].qs[j] >> 4) | static_cast<int>(((qh >> (j + qk / 2)) & 1) << 4);
      y[j] = static_cast<float>(lo) * d + m;
      y[j + qk / 2] = static_cast<float>(hi) * d + m;
    }
  }
}

void dequantize_q8_0(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const block_q8_0*>(src);
  for (int64_t i = 0; i < n / qk; ++i, y += qk) {
    const float d = fp16_to_fp32(load_half(b[i].d));
    for (int j = 0; j < qk; ++j) y[j] = static_cast<float>(b[i].qs[j]) * d;
  }
}

}  // namespace tandem::kernels::cpu
