// AVX-512 body of read_sum: 64-byte (one cache line) loads, four accumulators (256 bytes per
// iteration), enough independent loads in flight to saturate the memory system.
#include <immintrin.h>

#include <cstring>

#include "bench/read_kernels.h"

namespace tandem::bench::detail {

uint64_t read_sum_avx512(const std::byte* data, size_t bytes) {
  __m512i a0 = _mm512_setzero_si512(), a1 = a0, a2 = a0, a3 = a0;
  size_t i = 0;
  for (; i + 256 <= bytes; i += 256) {
    a0 = _mm512_add_epi64(a0, _mm512_loadu_si512(data + i));
    a1 = _mm512_add_epi64(a1, _mm512_loadu_si512(data + i + 64));
    a2 = _mm512_add_epi64(a2, _mm512_loadu_si512(data + i + 128));
    a3 = _mm512_add_epi64(a3, _mm512_loadu_si512(data + i + 192));
  }
  // Lanes summed through memory: GCC 12's _mm512_reduce_add_epi64 trips -Wuninitialized.
  alignas(64) uint64_t lanes[8];
  _mm512_store_si512(lanes, _mm512_add_epi64(_mm512_add_epi64(a0, a1), _mm512_add_epi64(a2, a3)));
  uint64_t sum = 0;
  for (uint64_t l : lanes) sum += l;
  for (; i < bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, data + i, 8);
    sum += w;
  }
  return sum;
}

}  // namespace tandem::bench::detail
