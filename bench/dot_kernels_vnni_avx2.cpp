// AVX-VNNI body of dot_chain (the avx2 path where the CPU has AVX-VNNI, as its packed kernels
// use it): k_dot_chains_avxvnni independent vpdpbusd chains on ymm registers.
#include <immintrin.h>

#include "bench/dot_kernels.h"

namespace tandem::bench::detail {

int64_t dot_chain_avxvnni(int64_t iterations, uint32_t a, uint32_t b) {
  __m256i va = _mm256_set1_epi32(static_cast<int>(a));
  const __m256i vb = _mm256_set1_epi32(static_cast<int>(b));
  __m256i acc[k_dot_chains_avxvnni];
  for (auto& x : acc) x = _mm256_setzero_si256();
  for (int64_t i = 0; i < iterations; ++i) {
    // The operand looks changed each time, so nothing about the products can be hoisted.
    asm("" : "+x"(va));
#pragma GCC unroll 12
    for (int c = 0; c < k_dot_chains_avxvnni; ++c) acc[c] = _mm256_dpbusd_avx_epi32(acc[c], va, vb);
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
