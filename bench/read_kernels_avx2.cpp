// AVX2 body of read_sum: 32-byte loads, four accumulators (128 bytes per iteration).
#include <immintrin.h>

#include <cstring>

#include "bench/read_kernels.h"

namespace tandem::bench::detail {

uint64_t read_sum_avx2(const std::byte* data, size_t bytes) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 128 <= bytes; i += 128) {
    a0 = _mm256_add_epi64(a0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + i)));
    a1 = _mm256_add_epi64(a1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + i + 32)));
    a2 = _mm256_add_epi64(a2, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + i + 64)));
    a3 = _mm256_add_epi64(a3, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(data + i + 96)));
  }
  const __m256i s = _mm256_add_epi64(_mm256_add_epi64(a0, a1), _mm256_add_epi64(a2, a3));
  alignas(32) uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), s);
  uint64_t sum = lanes[0] + lanes[1] + lanes[2] + lanes[3];
  for (; i < bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, data + i, 8);
    sum += w;
  }
  return sum;
}

}  // namespace tandem::bench::detail
