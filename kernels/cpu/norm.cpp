#include "kernels/cpu/ops.h"

#include <cmath>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops_simd.h"

namespace tandem::kernels::cpu {

void rms_norm(const float* x, const float* w, float* out, int64_t n, float eps) {
  if (n <= 0) return;
  if (active_isa() != isa::scalar) return rms_norm_avx2(x, w, out, n, eps);
  // Same arithmetic as ggml's rms_norm + mul: squares in float summed in double, one float
  // scale, then x*scale*w in that order, so hidden states track llama.cpp closely.
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const float scale = 1.0f / std::sqrt(mean + eps);
  if (w) {
    for (int64_t i = 0; i < n; ++i) out[i] = (x[i] * scale) * w[i];
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale;
  }
}

}  // namespace tandem::kernels::cpu
