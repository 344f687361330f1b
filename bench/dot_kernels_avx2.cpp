// AVX2 body of dot_chain: per chain one weight register and the maddubs + madd + add triple
// the AVX2 quantized kernels spend per 32 byte products.
#include <immintrin.h>

#include "bench/dot_kernels.h"

namespace tandem::bench::detail {

int64_t dot_chain_avx2(int64_t iterations, uint32_t a, uint32_t b) {
  constexpr int C = k_dot_chains_avx2;
  const __m256i vb = _mm256_set1_epi32(static_cast<int>(b));
  const __m256i ones = _mm256_set1_epi16(1);
  __m256i va[C], acc[C];
  for (int c = 0; c < C; ++c) {
    va[c] = _mm256_set1_epi32(static_cast<int>(a));
    acc[c] = _mm256_setzero_si256();
  }
  for (int64_t i = 0; i < iterations; ++i) {
#pragma GCC unroll 6
    for (int c = 0; c < C; ++c) {
      // Each weight register looks changed every time, so no product is hoisted or shared.
      asm("" : "+x"(va[c]));
      acc[c] = _mm256_add_epi32(acc[c], _mm256_madd_epi16(_mm256_maddubs_epi16(va[c], vb), ones));
    }
  }
  alignas(32) int32_t lanes[8];
  int64_t sum = 0;
  for (const auto& x : acc) {
    _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), x);
    for (int32_t l : lanes) sum += l;
  }
  return sum;
}

}  // namespace tandem::bench::detail
