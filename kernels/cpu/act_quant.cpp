#include "kernels/cpu/act_quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cpu/blocks.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/quants.h"

namespace tandem::kernels::cpu {
namespace {

// Q8_0 and Q8_1 activations are quantized the way llama.cpp's x86 build does at run time
// (its SIMD quantizers, not the scalar reference): the inverse scale is 127/amax rather than
// 1/(amax/127), and x * id is rounded to nearest with ties to even. Both choices move codes at
// rounding boundaries, and deep small models amplify such differences into visibly different
// logits, so matching them keeps our outputs comparable with llama.cpp's.
template <typename Block>
int quantize_block_q8(const float* x, Block& y, float& d_out) {
  constexpr int qk = k_qk_legacy;
  float amax = 0.0f;
  for (int j = 0; j < qk; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
  int sum = 0;
  for (int j = 0; j < qk; ++j) {
    y.qs[j] = static_cast<int8_t>(std::nearbyint(x[j] * id));  // default FP mode: ties to even
    sum += y.qs[j];
  }
  store_half(y.d, fp32_to_fp16(d));
  d_out = d;
  return sum;
}

void quantize_q8_0_act(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<block_q8_0*>(dst);
  float d;
  for (int64_t i = 0; i < n / k_qk_legacy; ++i, x += k_qk_legacy) quantize_block_q8(x, y[i], d);
}

void quantize_q8_1(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<block_q8_1*>(dst);
  for (int64_t i = 0; i < n / k_qk_legacy; ++i, x += k_qk_legacy) {
    float d;
    const int sum = quantize_block_q8(x, y[i], d);
    // s uses the unrounded d, as ggml does: it multiplies the fp16 weight offset m.
    store_half(y[i].s, fp32_to_fp16(static_cast<float>(sum) * d));
  }
}

void quantize_q8_k(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<block_q8_k*>(dst);
  constexpr int qk = k_qk_k;
  for (int64_t i = 0; i < n / qk; ++i, x += qk) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < qk; ++j) {
      if (std::fabs(x[j]) > amax) {
        amax = std::fabs(x[j]);
        max = x[j];
      }
    }
    if (amax == 0.0f) {
      y[i].d = 0.0f;
      std::memset(y[i].qs, 0, sizeof y[i].qs);
      std::memset(y[i].bsums, 0, sizeof y[i].bsums);
      continue;
    }
    // The extreme maps to -127 whatever its sign; the min() only matters for rounding at +127.
    const float iscale = -127.0f / max;
    for (int j = 0; j < qk; ++j) y[i].qs[j] = static_cast<int8_t>(std::min(127, nearest_int(iscale * x[j])));
    for (int g = 0; g < 16; ++g) {
      int sum = 0;
      for (int j = 0; j < 16; ++j) sum += y[i].qs[16 * g + j];
      y[i].bsums[g] = static_cast<int16_t>(sum);
    }
    y[i].d = 1.0f / iscale;
  }
}

}  // namespace

weight_type activation_type(weight_type weights) {
  switch (weights) {
    case weight_type::q4_0:
    case weight_type::q5_0:
    case weight_type::q8_0:
      return weight_type::q8_0;
    case weight_type::q4_1:
    case weight_type::q5_1:
      return weight_type::q8_1;
    case weight_type::q4_k:
    case weight_type::q5_k:
    case weight_type::q6_k:
      return weight_type::q8_k;
    case weight_type::f16:
      return weight_type::f16;
    case weight_type::bf16:
      return weight_type::bf16;
    case weight_type::f32:
      return weight_type::f32;
    default:
      throw std::invalid_argument("activation_type: weight type " + display_name(weights) + " has no CPU dot product");
  }
}

void quantize_activation_row(weight_type act, const float* src, void* dst, int64_t n) {
  const isa path = active_isa();
  if (path == isa::avx512) {
    switch (act) {
      case weight_type::q8_0:
        quantize_q8_0_act_avx512(src, dst, n);
        return;
      case weight_type::q8_1:
        quantize_q8_1_avx512(src, dst, n);
        return;
      case weight_type::q8_k:
        quantize_q8_k_avx512(src, dst, n);
        return;
      default:
        break;
    }
  } else if (path == isa::avx2) {
    switch (act) {
      case weight_type::q8_0:
        quantize_q8_0_act_avx2(src, dst, n);
        return;
      case weight_type::q8_1:
        quantize_q8_1_avx2(src, dst, n);
        return;
      case weight_type::q8_k:
        quantize_q8_k_avx2(src, dst, n);
        return;
      default:
        break;
    }
  }
  switch (act) {
    case weight_type::q8_0:
      quantize_q8_0_act(src, dst, n);
      return;
    case weight_type::q8_1:
      quantize_q8_1(src, dst, n);
      return;
    case weight_type::q8_k:
      quantize_q8_k(src, dst, n);
      return;
    case weight_type::f16:
    case weight_type::bf16:
    case weight_type::f32:
      quantize_row(act, src, dst, n);
      return;
    default:
      throw std::invalid_argument("quantize_activation_row: " + display_name(act) + " is not an activation type");
  }
}

void dequantize_activation_row(weight_type act, const void* src, float* dst, int64_t n) {
  switch (act) {
    case weight_type::q8_1: {
      const auto* b = static_cast<const block_q8_1*>(src);
      for (int64_t i = 0; i < n / k_qk_legacy; ++i) {
        const float d = fp16_to_fp32(load_half(b[i].d));
        for (int j = 0; j < k_qk_legacy; ++j) dst[i * k_qk_legacy + j] = d * static_cast<float>(b[i].qs[j]);
      }
      return;
    }
    case weight_type::q8_k: {
      const auto* b = static_cast<const block_q8_k*>(src);
      for (int64_t i = 0; i < n / k_qk_k; ++i)
        for (int j = 0; j < k_qk_k; ++j) dst[i * k_qk_k + j] = b[i].d * static_cast<float>(b[i].qs[j]);
      return;
    }
    case weight_type::q8_0:
    case weight_type::f16:
    case weight_type::bf16:
    case weight_type::f32:
      dequantize_row(act, src, dst, n);
      return;
    default:
      throw std::invalid_argument("dequantize_activation_row: " + display_name(act) + " is not an activation type");
  }
}

}  // namespace tandem::kernels::cpu
