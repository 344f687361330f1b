// AVX-512 attention: the kernel of attention_simd.h with 16-float registers for the row work
// (widening, value accumulation); the dot products keep the shared 8-lane order.
#include <immintrin.h>

#include <cstdint>

namespace tandem::kernels::cpu {
namespace {

struct avx512_lanes {
  using vec = __m512;
  static constexpr int W = 16;
  // Conversions use the zero-masking forms with every lane selected, which are the plain
  // instructions: GCC 12 warns (wrongly) that the unmasked intrinsics' undefined pass-through
  // may be uninitialized.
  static constexpr __mmask16 k_all = 0xFFFF;
  static vec load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, vec a) { _mm512_storeu_ps(p, a); }
  static vec zero() { return _mm512_setzero_ps(); }
  static vec set1(float x) { return _mm512_set1_ps(x); }
  static vec add(vec a, vec b) { return _mm512_add_ps(a, b); }
  static vec mul(vec a, vec b) { return _mm512_mul_ps(a, b); }
  static vec round_f16(vec a) {
    return _mm512_maskz_cvtph_ps(k_all, _mm512_maskz_cvtps_ph(k_all, a, _MM_FROUND_TO_NEAREST_INT));
  }
  static vec load_f16(const uint16_t* p) {
    return _mm512_maskz_cvtph_ps(k_all, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static vec unfused(vec a) {
    asm("" : "+v"(a));
    return a;
  }
};

}  // namespace
}  // namespace tandem::kernels::cpu

#include "kernels/cpu/attention_simd.h"

namespace tandem::kernels::cpu {

void attend_avx512(const attention_task& t, const attention_scratch& s) { simd_attention<avx512_lanes>::run(t, s); }

}  // namespace tandem::kernels::cpu
