// AVX-512 VNNI body of dot_chain: k_dot_chains independent vpdpbusd chains on registers.
#include <immintrin.h>

#include "bench/dot_kernels.h"

namespace tandem::bench::detail {

int64_t dot_chain_avx512(int64_t iterations, uint32_t a, uint32_t b) {
  __m512i va = _mm512_set1_epi32(static_cast<int>(a));
  const __m512i vb = _mm512_set1_epi32(static_cast<int>(b));
  __m512i acc[k_dot_chains_avx512];
  for (auto& x : acc) x = _mm512_setzero_si512();
  for (int64_t i = 0; i < iterations; ++i) {
    // The operand looks changed each time, so nothing about the products can be hoisted.
    asm("" : "+v"(va));
#pragma GCC unroll 12
    for (int c = 0; c < k_dot_chains_avx512; ++c) acc[c] = _mm512_dpbusd_epi32(acc[c], va, vb);
  }
  alignas(64) int32_t lanes[16];
  int64_t sum = 0;
  for (const auto& x : acc) {
    _mm512_store_si512(lanes, x);
    for (int32_t l : lanes) sum += l;
  }
  return sum;
}

}  // namespace tandem::bench::detail
