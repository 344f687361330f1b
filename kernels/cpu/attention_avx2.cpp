// AVX2 (+FMA, F16C) attention: the kernel of attention_simd.h over 8-float registers.
#include <immintrin.h>

#include "kernels/cpu/simd_math_avx2.h"

namespace tandem::kernels::cpu {
namespace {

struct avx2_lanes {
  using vec = __m256;
  static constexpr int W = 8;
  static constexpr int fold_slices = 8;  // value-accumulator registers a fold may hold (attention_simd.h)
  static vec load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, vec a) { _mm256_storeu_ps(p, a); }
  static vec zero() { return _mm256_setzero_ps(); }
  static vec set1(float x) { return _mm256_set1_ps(x); }
  static vec add(vec a, vec b) { return _mm256_add_ps(a, b); }
  static vec mul(vec a, vec b) { return _mm256_mul_ps(a, b); }
  static vec round_f16(vec a) { return avx2::round_f16(a); }
  static vec load_f16(const uint16_t* p) { return avx2::load_f16x8(p); }
  static vec unfused(vec a) {
    asm("" : "+x"(a));
    return a;
  }
};

}  // namespace
}  // namespace tandem::kernels::cpu

#include "kernels/cpu/attention_simd.h"

namespace tandem::kernels::cpu {

void attend_avx2(const attention_task& t, const attention_scratch& s) { simd_attention<avx2_lanes>::run(t, s); }

}  // namespace tandem::kernels::cpu
