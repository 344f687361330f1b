#include "kernels/cpu/ops.h"

#include <cmath>
#include <limits>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops_simd.h"

namespace tandem::kernels::cpu {

void softmax(float* x, int64_t n) {
  if (n <= 0) return;
  if (active_isa() != isa::scalar) return softmax_avx2(x, n);
  float max_v = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) max_v = x[i] > max_v ? x[i] : max_v;
  // Exponentials are F32; their sum is kept in double (as ggml's soft_max does) so long rows
  // (attention over many keys, a whole vocabulary) do not lose the small terms.
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max_v);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace tandem::kernels::cpu
