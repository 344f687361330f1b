// AVX-512 paths of element-wise ops whose contract is expf itself (ops_simd.h): the vector
// exponential avx512::expf_exact (simd_avx512.h) gives the scalar path's bits, so these are not
// approximations of it but the same results, several elements per instruction.
#include <cmath>
#include <cstdint>

#include "kernels/cpu/ops_simd.h"
#include "kernels/cpu/simd_avx512.h"

namespace tandem::kernels::cpu {

void expf_exact_avx512(const float* x, float* out, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(out + i, avx512::expf_exact(_mm512_loadu_ps(x + i)));
  for (; i < n; ++i) out[i] = std::exp(x[i]);
}

void swiglu_avx512(float* gate, const float* up, int64_t n) {
  // swiglu's g / (1 + expf(-g)) * u, operation for operation.
  const __m512 one = _mm512_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i);
    const __m512 e = avx512::expf_exact(_mm512_xor_ps(g, _mm512_set1_ps(-0.0f)));  // -g, as the scalar path
    _mm512_storeu_ps(gate + i, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), _mm512_loadu_ps(up + i)));
  }
  for (; i < n; ++i) gate[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

}  // namespace tandem::kernels::cpu
