// AVX-512 building blocks shared by the *_avx512.cpp kernels. Include it only from files
// compiled with the AVX-512 flags (kernels/CMakeLists.txt sets them for *_avx512.cpp).
// Everything is `static` (internal linkage) for the same reason as in simd_avx2.h: no
// AVX-512-encoded copy may be merged into code that runs on CPUs without it.
#pragma once

#include <immintrin.h>

#include <cstdint>
#include <cstring>

#include "kernels/cpu/blocks.h"

namespace tandem::kernels::cpu::avx512 {

static inline float half_to_float(const half_bytes& h) { return _cvtsh_ss(load_half(h)); }

static inline float hsum(__m512 v) { return _mm512_reduce_add_ps(v); }

static inline __m512i load64(const void* p) { return _mm512_loadu_si512(p); }
static inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

// Two unaligned 32-byte loads into one register: a in the low half, b in the high half.
static inline __m512i load32x2(const void* a, const void* b) {
  return _mm512_inserti64x4(_mm512_castsi256_si512(load32(a)), load32(b), 1);
}

// Calls f.template operator()<NW, NR>() with NW = n_w (1..4) and NR = n_act (1..4) as
// compile-time constants, so a tile's accumulators live in registers.
template <class F>
static inline void with_tile(int n_w, int n_act, F&& f) {
  auto rows = [&]<int NW>() {
    switch (n_act) {
      case 1: f.template operator()<NW, 1>(); break;
      case 2: f.template operator()<NW, 2>(); break;
      case 3: f.template operator()<NW, 3>(); break;
      default: f.template operator()<NW, 4>(); break;
    }
  };
  switch (n_w) {
    case 1: rows.template operator()<1>(); break;
    case 2: rows.template operator()<2>(); break;
    case 3: rows.template operator()<3>(); break;
    default: rows.template operator()<4>(); break;
  }
}

}  // namespace tandem::kernels::cpu::avx512
