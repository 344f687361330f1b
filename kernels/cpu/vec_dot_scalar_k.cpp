// Scalar reference dots for the K-quants against Q8_K activations. Per super-block the
// scaled code products and the min terms are summed exactly in integers; the mins use the
// activation's bsums (sums of 16 codes), which is also how the SIMD paths fold them.
#include "kernels/cpu/blocks.h"
#include "kernels/cpu/quants.h"
#include "kernels/cpu/vec_dot.h"

namespace tandem::kernels::cpu {
namespace {

constexpr int qk = k_qk_k;

template <class F>
void for_each_row(const void* act, size_t act_stride, int n_act, float* out, int64_t out_stride, F one) {
  const auto* a = static_cast<const uint8_t*>(act);
  for (int r = 0; r < n_act; ++r) out[r * out_stride] = one(reinterpret_cast<const block_q8_k*>(a + r * act_stride));
}

// Q4_K and Q5_K share everything but where the code's fifth bit comes from.
template <bool five_bit, class Block>
float dot_k_affine(int64_t n, const Block* x, const block_q8_k* y) {
  float sum = 0;
  for (int64_t b = 0; b < n / qk; ++b) {
    uint8_t sc[8], m[8];
    unpack_k_scales(x[b].scales, sc, m);
    int isum = 0, imin = 0;
    for (int c = 0; c < 4; ++c) {
      int dot_lo = 0, dot_hi = 0;
      for (int l = 0; l < 32; ++l) {
        int lo = x[b].qs[32 * c + l] & 0xF;
        int hi = x[b].qs[32 * c + l] >> 4;
        if constexpr (five_bit) {
          lo |= ((x[b].qh[l] >> (2 * c)) & 1) << 4;
          hi |= ((x[b].qh[l] >> (2 * c + 1)) & 1) << 4;
        }
        dot_lo += lo * y[b].qs[64 * c + l];
        dot_hi += hi * y[b].qs[64 * c + 32 + l];
      }
      isum += sc[2 * c] * dot_lo + sc[2 * c + 1] * dot_hi;
    }
    for (int j = 0; j < 8; ++j) imin += m[j] * (y[b].bsums[2 * j] + y[b].bsums[2 * j + 1]);
    const float d = fp16_to_fp32(load_half(x[b].d)) * y[b].d;
    const float dmin = fp16_to_fp32(load_half(x[b].dmin)) * y[b].d;
    sum += d * static_cast<float>(isum) - dmin * static_cast<float>(imin);
  }
  return sum;
}

}  // namespace

void vec_dot_q4_k_scalar(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out,
                         int64_t out_stride) {
  const auto* x = static_cast<const block_q4_k*>(w);
  for_each_row(act, act_stride, n_act, out, out_stride,
               [&](const block_q8_k* y) { return dot_k_affine<false>(n, x, y); });
}

void vec_dot_q5_k_scalar(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out,
                         int64_t out_stride) {
  const auto* x = static_cast<const block_q5_k*>(w);
  for_each_row(act, act_stride, n_act, out, out_stride,
               [&](const block_q8_k* y) { return dot_k_affine<true>(n, x, y); });
}

void vec_dot_q6_k_scalar(int64_t n, const void* w, const void* act, size_t act_stride, int n_act, float* out,
                         int64_t out_stride) {
  const auto* x = static_cast<const block_q6_k*>(w);
  for_each_row(act, act_stride, n_act, out, out_stride, [&](const block_q8_k* y) {
    float sum = 0;
    for (int64_t b = 0; b < n / qk; ++b) {
      int isum = 0;
      for (int h = 0; h < 2; ++h) {
        const uint8_t* ql = x[b].ql + 64 * h;
        const uint8_t* qh = x[b].qh + 32 * h;
        const int8_t* sc = x[b].scales + 8 * h;
        const int8_t* q8 = y[b].qs + 128 * h;
        int part[8] = {};  // per 16-element sub-block of this half
        for (int l = 0; l < 32; ++l) {
          const int is = l / 16;
          int q[4];
          unpack_q6_k_codes(ql, qh, l, q);
          for (int k = 0; k < 4; ++k) part[is + 2 * k] += q[k] * q8[l + 32 * k];
        }
        for (int s = 0; s < 8; ++s) isum += sc[s] * part[s];
      }
      sum += fp16_to_fp32(load_half(x[b].d)) * y[b].d * static_cast<float>(isum);
    }
    return sum;
  });
}

}  // namespace tandem::kernels::cpu
