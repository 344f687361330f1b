// A barrier against floating-point contraction for the kernels whose results must keep the
// bits of separate multiplies and adds (llama.cpp's, or the scalar reference's) although
// their files are built with -mfma: the asm claims to change x, so the product that made it
// cannot be merged with the add it feeds into one fused multiply-add. It costs no
// instruction. For float, __m128 and __m256 (the "x" constraint: xmm/ymm registers).
// Internal linkage, as every helper the ISA-specific files share.
#pragma once

namespace tandem::kernels::cpu {
namespace {

template <class V>
static inline V unfused(V x) {
  asm("" : "+x"(x));
  return x;
}

}  // namespace
}  // namespace tandem::kernels::cpu
