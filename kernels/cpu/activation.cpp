#include "kernels/cpu/ops.h"

#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops_simd.h"
#include "kernels/cpu/thread_pool.h"

#include <cmath>

namespace tandem::kernels::cpu {

void swiglu(float* gate, const float* up, int64_t n) {
  // silu(g) = g * sigmoid(g), written as g / (1 + e^-g) like ggml: for very negative g,
  // e^-g overflows to inf and the result is a clean -0 instead of inf * 0 = NaN.
  // expf itself: an AVX2 version with the vector e^x of simd_math_avx2.h (within 2 ulp) flips
  // greedy tokens of the SmolLM2 llama.cpp fixtures (tests/models). The AVX2 and AVX-512 forms
  // give these same bits (expf_exact_avx2.h, expf_exact_avx512.h). Large calls (batched decode,
  // prefill) are split over the pool too, and the rows the server computes take swiglu_fast.
  switch (active_isa()) {
    case isa::avx512: return swiglu_avx512(gate, up, n);
    case isa::avx2: return swiglu_exact_avx2(gate, up, n);
    default: break;
  }
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void swiglu(float* gate, const float* up, int64_t n, thread_pool* pool) {
  // Below this many elements a wakeup of the workers costs more than the expf calls it saves.
  constexpr int64_t k_min_chunk = 4096;
  if (!pool || n < 2 * k_min_chunk) {
    swiglu(gate, up, n);
    return;
  }
  pool->parallel_for(n, k_min_chunk, [&](int64_t b, int64_t e) { swiglu(gate + b, up + b, e - b); });
}

void swiglu_fast(float* gate, const float* up, int64_t n, thread_pool* pool) {
  if (active_isa() == isa::scalar) return swiglu(gate, up, n, pool);
  // The vector form is several times cheaper per element, so it pays for a wakeup later.
  constexpr int64_t k_min_chunk = 16384;
  if (!pool || n < 2 * k_min_chunk) {
    swiglu_avx2(gate, up, n);
    return;
  }
  pool->parallel_for(n, k_min_chunk, [&](int64_t b, int64_t e) { swiglu_avx2(gate + b, up + b, e - b); });
}

}  // namespace tandem::kernels::cpu
