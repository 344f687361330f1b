// The scalar reference conversions of quants.h: f16 and bf16, the legacy 32-element blocks,
// the K-quant super-blocks, and the dispatch on the weight type.
#include "kernels/cpu/quants.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>

#include "kernels/cpu/blocks.h"

namespace tandem::kernels::cpu {

float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  const uint32_t exp = (h >> 10) & 0x1f;
  const uint32_t mant = h & 0x3ff;
  uint32_t bits;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24 is exact in float.
    float f = static_cast<float>(mant) * 5.9604644775390625e-8f;
    std::memcpy(&bits, &f, sizeof bits);
    bits |= sign;
  } else if (exp == 31) {
    bits = sign | 0x7f800000u | (mant << 13);  // inf, or NaN keeping its payload
  } else {
    bits = sign | ((exp + 112) << 23) | (mant << 13);  // rebias 15 -> 127
  }
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

uint16_t fp32_to_fp16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  const uint16_t sign = static_cast<uint16_t>((u >> 16) & 0x8000);
  const uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00);  // NaN stays a (quiet) NaN
  // 65520 (0x477ff000) is the midpoint between the largest half, 65504, and 2^16; it ties
  // to the even neighbour 2^16, so it and everything above overflow to infinity.
  if (a >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00);
  const uint32_t e = a >> 23;
  if (e < 113) {
    // Below 2^-14: a half subnormal m * 2^-24. Values at or below 2^-25 round to zero.
    if (a <= 0x33000000u) return sign;
    const uint32_t mant = (a & 0x7fffff) | 0x800000;
    const uint32_t shift = 126 - e;  // 14..24
    uint32_t m = mant >> shift;
    const uint32_t rem = mant & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rem > half || (rem == half && (m & 1))) ++m;  // m may reach 1024 = smallest normal
    return static_cast<uint16_t>(sign | m);
  }
  uint32_t h = ((e - 112) << 10) | ((a >> 13) & 0x3ff);
  const uint32_t rem = a & 0x1fff;
  if (rem > 0x1000 || (rem == 0x1000 && (h & 1))) ++h;  // a carry into the exponent is right
  return static_cast<uint16_t>(sign | h);
}

float bf16_to_fp32(uint16_t h) {
  const uint32_t bits = static_cast<uint32_t>(h) << 16;
  float out;
  std::memcpy(&out, &bits, sizeof out);
  return out;
}

uint16_t fp32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  return static_cast<uint16_t>((u + 0x7fffu + ((u >> 16) & 1)) >> 16);
}

// Legacy 32-element quant blocks. The quantizers follow ggml's *_ref functions formula for
// formula (scale from the signed absolute maximum, truncation after a +0.5 bias), so models
// synthesized here quantize like models made by llama.cpp's tools.
namespace {
namespace legacy {

constexpr int qk = k_qk_legacy;

// The value of largest magnitude, with its sign (ties keep the first).
float signed_absmax(const float* x) {
  float amax = 0.0f, max = 0.0f;
  for (int j = 0; j < qk; ++j) {
    if (amax < std::fabs(x[j])) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  return max;
}

void min_max(const float* x, float& mn, float& mx) {
  mn = FLT_MAX;
  mx = -FLT_MAX;
  for (int j = 0; j < qk; ++j) {
    mn = std::min(mn, x[j]);
    mx = std::max(mx, x[j]);
  }
}

// ggml truncates toward zero after adding the bias; the clamp only guards the top code.
inline uint8_t trunc_code(float v, int top) { return static_cast<uint8_t>(std::min(top, static_cast<int>(v))); }

uint32_t load_qh(const uint8_t* qh) {
  uint32_t v;
  std::memcpy(&v, qh, sizeof v);
  return v;
}

void quantize_q4_0(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<block_q4_0*>(dst);
  for (int64_t i = 0; i < n / qk; ++i, x += qk) {
    // The extreme value maps to code 0 (-8), the end of the range with one more step.
    const float d = signed_absmax(x) / -8;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_half(y[i].d, fp32_to_fp16(d));
    for (int j = 0; j < qk / 2; ++j) {
      const uint8_t lo = trunc_code(x[j] * id + 8.5f, 15);
      const uint8_t hi = trunc_code(x[j + qk / 2] * id + 8.5f, 15);
      y[i].qs[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

void quantize_q4_1(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<block_q4_1*>(dst);
  for (int64_t i = 0; i < n / qk; ++i, x += qk) {
    float mn, mx;
    min_max(x, mn, mx);
    const float d = (mx - mn) / 15;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_half(y[i].d, fp32_to_fp16(d));
    store_half(y[i].m, fp32_to_fp16(mn));
    for (int j = 0; j < qk / 2; ++j) {
      const uint8_t lo = trunc_code((x[j] - mn) * id + 0.5f, 15);
      const uint8_t hi = trunc_code((x[j + qk / 2] - mn) * id + 0.5f, 15);
      y[i].qs[j] = static_cast<uint8_t>(lo | (hi << 4));
    }
  }
}

void quantize_q5_0(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<block_q5_0*>(dst);
  for (int64_t i = 0; i < n / qk; ++i, x += qk) {
    const float d = signed_absmax(x) / -16;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_half(y[i].d, fp32_to_fp16(d));
    uint32_t qh = 0;
    for (int j = 0; j < qk / 2; ++j) {
      const uint8_t lo = trunc_code(x[j] * id + 16.5f, 31);
      const uint8_t hi = trunc_code(x[j + qk / 2] * id + 16.5f, 31);
      y[i].qs[j] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
      qh |= static_cast<uint32_t>(lo >> 4) << j;
      qh |= static_cast<uint32_t>(hi >> 4) << (j + qk / 2);
    }
    std::memcpy(y[i].qh, &qh, sizeof qh);
  }
}

void quantize_q5_1(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<block_q5_1*>(dst);
  for (int64_t i = 0; i < n / qk; ++i, x += qk) {
    float mn, mx;
    min_max(x, mn, mx);
    const float d = (mx - mn) / 31;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_half(y[i].d, fp32_to_fp16(d));
    store_half(y[i].m, fp32_to_fp16(mn));
    uint32_t qh = 0;
    for (int j = 0; j < qk / 2; ++j) {
      const uint8_t lo = trunc_code((x[j] - mn) * id + 0.5f, 31);
      const uint8_t hi = trunc_code((x[j + qk / 2] - mn) * id + 0.5f, 31);
      y[i].qs[j] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
      qh |= static_cast<uint32_t>(lo >> 4) << j;
      qh |= static_cast<uint32_t>(hi >> 4) << (j + qk / 2);
    }
    std::memcpy(y[i].qh, &qh, sizeof qh);
  }
}

void quantize_q8_0(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<block_q8_0*>(dst);
  for (int64_t i = 0; i < n / qk; ++i, x += qk) {
    float amax = 0.0f;
    for (int j = 0; j < qk; ++j) amax = std::max(amax, std::fabs(x[j]));
    const float d = amax / 127;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    store_half(y[i].d, fp32_to_fp16(d));
    for (int j = 0; j < qk; ++j) y[i].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
  }
}

void dequantize_q4_0(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const block_q4_0*>(src);
  for (int64_t i = 0; i < n / qk; ++i, y += qk) {
    const float d = fp16_to_fp32(load_half(b[i].d));
    for (int j = 0; j < qk / 2; ++j) {
      y[j] = static_cast<float>((b[i].qs[j] & 0xF) - 8) * d;
      y[j + qk / 2] = static_cast<float>((b[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void dequantize_q4_1(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const block_q4_1*>(src);
  for (int64_t i = 0; i < n / qk; ++i, y += qk) {
    const float d = fp16_to_fp32(load_half(b[i].d));
    const float m = fp16_to_fp32(load_half(b[i].m));
    for (int j = 0; j < qk / 2; ++j) {
      y[j] = static_cast<float>(b[i].qs[j] & 0xF) * d + m;
      y[j + qk / 2] = static_cast<float>(b[i].qs[j] >> 4) * d + m;
    }
  }
}

void dequantize_q5_0(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const block_q5_0*>(src);
  for (int64_t i = 0; i < n / qk; ++i, y += qk) {
    const float d = fp16_to_fp32(load_half(b[i].d));
    const uint32_t qh = load_qh(b[i].qh);
    for (int j = 0; j < qk / 2; ++j) {
      const int lo = (b[i].qs[j] & 0xF) | static_cast<int>(((qh >> j) & 1) << 4);
      const int hi = (b[i].qs[j] >> 4) | static_cast<int>(((qh >> (j + qk / 2)) & 1) << 4);
      y[j] = static_cast<float>(lo - 16) * d;
      y[j + qk / 2] = static_cast<float>(hi - 16) * d;
    }
  }
}

void dequantize_q5_1(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const block_q5_1*>(src);
  for (int64_t i = 0; i < n / qk; ++i, y += qk) {
    const float d = fp16_to_fp32(load_half(b[i].d));
    const float m = fp16_to_fp32(load_half(b[i].m));
    const uint32_t qh = load_qh(b[i].qh);
    for (int j = 0; j < qk / 2; ++j) {
      const int lo = (b[i].qs[j] & 0xF) | static_cast<int>(((qh >> j) & 1) << 4);
      const int hi = (b[i].qs[j] >> 4) | static_cast<int>(((qh >> (j + qk / 2)) & 1) << 4);
      y[j] = static_cast<float>(lo) * d + m;
      y[j + qk / 2] = static_cast<float>(hi) * d + m;
    }
  }
}

void dequantize_q8_0(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const block_q8_0*>(src);
  for (int64_t i = 0; i < n / qk; ++i, y += qk) {
    const float d = fp16_to_fp32(load_half(b[i].d));
    for (int j = 0; j < qk; ++j) y[j] = static_cast<float>(b[i].qs[j]) * d;
  }
}

}  // namespace legacy
}  // namespace

// K-quant super-blocks (256 elements): Q4_K, Q5_K (8 sub-blocks of 32, scale and min each)
// and Q6_K (16 sub-blocks of 16, signed scale each).
//
// The quantizers are tandem's own, not ggml's: per sub-block they try a handful of step
// sizes around the range / code-count guess, refit scale (and offset) by least squares for
// the codes each produces, and keep the fit with the least squared error. Then the sub-block
// scales are themselves quantized against the block's fp16 super-scale, and every element is
// re-coded with the scale it will actually be decoded with. Deterministic (no data-dependent
// iteration order, no randomness), and a few percent worse than llama-quantize at most.
namespace {
namespace k_quants {

constexpr int qk = k_qk_k;

struct affine_fit {
  float scale = 0.0f;  // >= 0
  float min = 0.0f;    // >= 0; the sub-block decodes as scale * q - min
};

// Best (scale, min) for x ≈ scale * q - min with q in [0, nmax]. The offset -min is kept
// <= 0 because the format stores min as an unsigned 6-bit multiple of dmin.
affine_fit fit_affine(const float* x, int n, int nmax) {
  float lo = *std::min_element(x, x + n);
  const float hi = *std::max_element(x, x + n);
  lo = std::min(lo, 0.0f);
  if (hi <= lo) return {0.0f, -lo};  // constant sub-block: all codes 0, decoded as -min

  affine_fit best;
  double best_err = std::numeric_limits<double>::infinity();
  for (int step = -4; step <= 8; ++step) {
    const float s0 = (hi - lo) / (static_cast<float>(nmax) + 0.25f * static_cast<float>(step));
    double sq = 0, sqq = 0, sx = 0, sxq = 0;
    int q[32];
    for (int i = 0; i < n; ++i) {
      q[i] = std::clamp(nearest_int((x[i] - lo) / s0), 0, nmax);
      sq += q[i];
      sqq += static_cast<double>(q[i]) * q[i];
      sx += x[i];
      sxq += static_cast<double>(x[i]) * q[i];
    }
    // Unconstrained least squares for x ≈ s*q + b, then fall back to b = 0 if b > 0.
    double s = 0, b = 0;
    const double det = n * sqq - sq * sq;
    if (det > 0) {
      s = (n * sxq - sq * sx) / det;
      b = (sx - s * sq) / n;
    }
    if (det <= 0 || b > 0) {
      b = 0;
      s = sqq > 0 ? sxq / sqq : 0;
    }
    if (s <= 0) continue;
    double err = 0;
    for (int i = 0; i < n; ++i) {
      const double e = s * q[i] + b - x[i];
      err += e * e;
    }
    if (err < best_err) {
      best_err = err;
      best = {static_cast<float>(s), static_cast<float>(-b)};
    }
  }
  if (!(best_err < std::numeric_limits<double>::infinity())) best = {(hi - lo) / static_cast<float>(nmax), -lo};
  return best;
}

// Best signed scale for x ≈ scale * q with q in [-32, 31]. The extreme element is aimed at
// -32, the side of the range with the extra code, whatever its sign.
float fit_symmetric(const float* x, int n) {
  float amax = 0.0f, max = 0.0f;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (amax == 0.0f) return 0.0f;
  float best = max / -32.0f;
  double best_err = std::numeric_limits<double>::infinity();
  for (int step = -6; step <= 6; ++step) {
    const float iscale = -(32.0f + 0.25f * static_cast<float>(step)) / max;
    double sxq = 0, sqq = 0;
    int q[16];
    for (int i = 0; i < n; ++i) {
      q[i] = std::clamp(nearest_int(iscale * x[i]), -32, 31);
      sxq += static_cast<double>(x[i]) * q[i];
      sqq += static_cast<double>(q[i]) * q[i];
    }
    if (sqq <= 0) continue;
    const double s = sxq / sqq;
    double err = 0;
    for (int i = 0; i < n; ++i) {
      const double e = s * q[i] - x[i];
      err += e * e;
    }
    if (err < best_err) {
      best_err = err;
      best = static_cast<float>(s);
    }
  }
  return best;
}

// Quantizes `v` (>= 0) to a 6-bit multiple of `unit`.
uint8_t code6(float v, float unit) { return unit > 0 ? static_cast<uint8_t>(std::clamp(nearest_int(v / unit), 0, 63)) : 0; }

// Packs eight 6-bit scales and mins into the 12-byte layout unpack_k_scale reads.
void pack_k_scales(const uint8_t sc[8], const uint8_t m[8], uint8_t* out) {
  for (int j = 0; j < 4; ++j) {
    out[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    out[j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
    out[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
  }
}

// Shared by Q4_K (nmax 15) and Q5_K (nmax 31): fills d, dmin, scales and the codes L[256].
void quantize_k_affine(const float* x, int nmax, half_bytes& d_out, half_bytes& dmin_out, uint8_t* scales, uint8_t* L) {
  affine_fit fits[8];
  float max_scale = 0.0f, max_min = 0.0f;
  for (int j = 0; j < 8; ++j) {
    fits[j] = fit_affine(x + 32 * j, 32, nmax);
    max_scale = std::max(max_scale, fits[j].scale);
    max_min = std::max(max_min, fits[j].min);
  }
  const uint16_t d16 = fp32_to_fp16(max_scale / 63.0f);
  const uint16_t dmin16 = fp32_to_fp16(max_min / 63.0f);
  store_half(d_out, d16);
  store_half(dmin_out, dmin16);
  const float d = fp16_to_fp32(d16), dmin = fp16_to_fp32(dmin16);
  uint8_t sc[8], m[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = code6(fits[j].scale, d);
    m[j] = code6(fits[j].min, dmin);
  }
  pack_k_scales(sc, m, scales);
  // Re-code with the scale and min the decoder will use, so their rounding is absorbed.
  for (int j = 0; j < 8; ++j) {
    const float ds = d * sc[j], dm = dmin * m[j];
    for (int i = 0; i < 32; ++i) {
      const int l = 32 * j + i;
      L[l] = ds > 0 ? static_cast<uint8_t>(std::clamp(nearest_int((x[l] + dm) / ds), 0, nmax)) : 0;
    }
  }
}

// Low nibbles of the codes in Q4_K / Q5_K order.
void pack_k_nibbles(const uint8_t* L, uint8_t* qs) {
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) qs[32 * c + l] = static_cast<uint8_t>((L[64 * c + l] & 0xF) | ((L[64 * c + 32 + l] & 0xF) << 4));
}

void quantize_q4_k(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<block_q4_k*>(dst);
  for (int64_t i = 0; i < n / qk; ++i, x += qk) {
    uint8_t L[qk];
    quantize_k_affine(x, 15, y[i].d, y[i].dmin, y[i].scales, L);
    pack_k_nibbles(L, y[i].qs);
  }
}

void quantize_q5_k(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<block_q5_k*>(dst);
  for (int64_t i = 0; i < n / qk; ++i, x += qk) {
    uint8_t L[qk];
    quantize_k_affine(x, 31, y[i].d, y[i].dmin, y[i].scales, L);
    pack_k_nibbles(L, y[i].qs);
    std::memset(y[i].qh, 0, sizeof y[i].qh);
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l) {
        y[i].qh[l] |= static_cast<uint8_t>((L[64 * c + l] >> 4) << (2 * c));
        y[i].qh[l] |= static_cast<uint8_t>((L[64 * c + 32 + l] >> 4) << (2 * c + 1));
      }
  }
}

void quantize_q6_k(const float* x, void* dst, int64_t n) {
  auto* y = static_cast<block_q6_k*>(dst);
  for (int64_t i = 0; i < n / qk; ++i, x += qk) {
    float s[16];
    float max_abs = 0.0f;
    for (int j = 0; j < 16; ++j) {
      s[j] = fit_symmetric(x + 16 * j, 16);
      max_abs = std::max(max_abs, std::fabs(s[j]));
    }
    const uint16_t d16 = fp32_to_fp16(max_abs / 127.0f);
    store_half(y[i].d, d16);
    const float d = fp16_to_fp32(d16);
    uint8_t L[qk];
    for (int j = 0; j < 16; ++j) {
      const int sc = d > 0 ? std::clamp(nearest_int(s[j] / d), -128, 127) : 0;
      y[i].scales[j] = static_cast<int8_t>(sc);
      const float ds = d * static_cast<float>(sc);
      for (int k = 0; k < 16; ++k) {
        const int l = 16 * j + k;
        L[l] = static_cast<uint8_t>(ds != 0 ? std::clamp(nearest_int(x[l] / ds), -32, 31) + 32 : 32);
      }
    }
    // Each 128-element half: ql holds low nibbles of elements l, l+32 (low) and l+64, l+96
    // (high); qh packs their top two bits, two per element, in that order.
    for (int h = 0; h < 2; ++h) {
      const uint8_t* Lh = L + 128 * h;
      uint8_t* ql = y[i].ql + 64 * h;
      uint8_t* qh = y[i].qh + 32 * h;
      for (int l = 0; l < 32; ++l) {
        ql[l] = static_cast<uint8_t>((Lh[l] & 0xF) | ((Lh[l + 64] & 0xF) << 4));
        ql[l + 32] = static_cast<uint8_t>((Lh[l + 32] & 0xF) | ((Lh[l + 96] & 0xF) << 4));
        qh[l] = static_cast<uint8_t>((Lh[l] >> 4) | ((Lh[l + 32] >> 4) << 2) | ((Lh[l + 64] >> 4) << 4) | ((Lh[l + 96] >> 4) << 6));
      }
    }
  }
}

void dequantize_q4_k(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const block_q4_k*>(src);
  for (int64_t i = 0; i < n / qk; ++i) {
    const float d = fp16_to_fp32(load_half(b[i].d));
    const float dmin = fp16_to_fp32(load_half(b[i].dmin));
    const uint8_t* q = b[i].qs;
    for (int c = 0; c < 4; ++c, q += 32, y += 64) {
      uint8_t sc0, m0, sc1, m1;
      unpack_k_scale(b[i].scales, 2 * c, sc0, m0);
      unpack_k_scale(b[i].scales, 2 * c + 1, sc1, m1);
      const float d0 = d * sc0, o0 = dmin * m0, d1 = d * sc1, o1 = dmin * m1;
      for (int l = 0; l < 32; ++l) {
        y[l] = d0 * static_cast<float>(q[l] & 0xF) - o0;
        y[l + 32] = d1 * static_cast<float>(q[l] >> 4) - o1;
      }
    }
  }
}

void dequantize_q5_k(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const block_q5_k*>(src);
  for (int64_t i = 0; i < n / qk; ++i) {
    const float d = fp16_to_fp32(load_half(b[i].d));
    const float dmin = fp16_to_fp32(load_half(b[i].dmin));
    const uint8_t* q = b[i].qs;
    const uint8_t* qh = b[i].qh;
    for (int c = 0; c < 4; ++c, q += 32, y += 64) {
      uint8_t sc0, m0, sc1, m1;
      unpack_k_scale(b[i].scales, 2 * c, sc0, m0);
      unpack_k_scale(b[i].scales, 2 * c + 1, sc1, m1);
      const float d0 = d * sc0, o0 = dmin * m0, d1 = d * sc1, o1 = dmin * m1;
      for (int l = 0; l < 32; ++l) {
        const int lo = (q[l] & 0xF) | (((qh[l] >> (2 * c)) & 1) << 4);
        const int hi = (q[l] >> 4) | (((qh[l] >> (2 * c + 1)) & 1) << 4);
        y[l] = d0 * static_cast<float>(lo) - o0;
        y[l + 32] = d1 * static_cast<float>(hi) - o1;
      }
    }
  }
}

void dequantize_q6_k(const void* src, float* y, int64_t n) {
  const auto* b = static_cast<const block_q6_k*>(src);
  for (int64_t i = 0; i < n / qk; ++i) {
    const float d = fp16_to_fp32(load_half(b[i].d));
    for (int h = 0; h < 2; ++h, y += 128) {
      const uint8_t* ql = b[i].ql + 64 * h;
      const uint8_t* qh = b[i].qh + 32 * h;
      const int8_t* sc = b[i].scales + 8 * h;
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        int q[4];
        unpack_q6_k_codes(ql, qh, l, q);
        for (int k = 0; k < 4; ++k) y[l + 32 * k] = d * static_cast<float>(sc[is + 2 * k]) * static_cast<float>(q[k]);
      }
    }
  }
}

}  // namespace k_quants
}  // namespace

namespace {

[[noreturn]] void unsupported(const char* what, weight_type t) {
  throw std::invalid_argument(std::string(what) + ": weight type " + display_name(t) + " is not supported by the CPU kernels");
}

void check_length(const char* what, weight_type t, int64_t n) {
  const int64_t be = info(t).block_elems;
  if (n < 0 || n % be != 0)
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(n) + " elements is not a multiple of " + display_name(t) + "'s block of " +
                                std::to_string(be));
}

}  // namespace

void dequantize_row(weight_type t, const void* src, float* dst, int64_t n) {
  check_length("dequantize_row", t, n);
  const auto* bytes = static_cast<const uint8_t*>(src);
  switch (t) {
    case weight_type::f32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case weight_type::f16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, bytes + 2 * i, sizeof h);
        dst[i] = fp16_to_fp32(h);
      }
      return;
    case weight_type::bf16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, bytes + 2 * i, sizeof h);
        dst[i] = bf16_to_fp32(h);
      }
      return;
    case weight_type::q4_0:
      legacy::dequantize_q4_0(src, dst, n);
      return;
    case weight_type::q4_1:
      legacy::dequantize_q4_1(src, dst, n);
      return;
    case weight_type::q5_0:
      legacy::dequantize_q5_0(src, dst, n);
      return;
    case weight_type::q5_1:
      legacy::dequantize_q5_1(src, dst, n);
      return;
    case weight_type::q8_0:
      legacy::dequantize_q8_0(src, dst, n);
      return;
    case weight_type::q4_k:
      k_quants::dequantize_q4_k(src, dst, n);
      return;
    case weight_type::q5_k:
      k_quants::dequantize_q5_k(src, dst, n);
      return;
    case weight_type::q6_k:
      k_quants::dequantize_q6_k(src, dst, n);
      return;
    default:
      unsupported("dequantize_row", t);
  }
}

void quantize_row(weight_type t, const float* src, void* dst, int64_t n) {
  check_length("quantize_row", t, n);
  auto* out = static_cast<uint8_t*>(dst);
  switch (t) {
    case weight_type::f32:
      std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
      return;
    case weight_type::f16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_fp16(src[i]);
        std::memcpy(out + 2 * i, &h, sizeof h);
      }
      return;
    case weight_type::bf16:
      for (int64_t i = 0; i < n; ++i) {
        const uint16_t h = fp32_to_bf16(src[i]);
        std::memcpy(out + 2 * i, &h, sizeof h);
      }
      return;
    case weight_type::q4_0:
      legacy::quantize_q4_0(src, dst, n);
      return;
    case weight_type::q4_1:
      legacy::quantize_q4_1(src, dst, n);
      return;
    case weight_type::q5_0:
      legacy::quantize_q5_0(src, dst, n);
      return;
    case weight_type::q5_1:
      legacy::quantize_q5_1(src, dst, n);
      return;
    case weight_type::q8_0:
      legacy::quantize_q8_0(src, dst, n);
      return;
    case weight_type::q4_k:
      k_quants::quantize_q4_k(src, dst, n);
      return;
    case weight_type::q5_k:
      k_quants::quantize_q5_k(src, dst, n);
      return;
    case weight_type::q6_k:
      k_quants::quantize_q6_k(src, dst, n);
      return;
    default:
      unsupported("quantize_row", t);
  }
}

}  // namespace tandem::kernels::cpu
