#include "kernels/cpu/quants.h"

#include <cstring>
#include <stdexcept>
#include <string>

#include "kernels/cpu/quants_impl.h"

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

namespace {

[[noreturn]] void unsupported(const char* what, weight_type t) {
  throw std::invalid_argument(std::string(what) + ": weight type " + display_name(t) +
                              " is not supported by the CPU kernels");
}

void check_length(const char* what, weight_type t, int64_t n) {
  const int64_t be = info(t).block_elems;
  if (n < 0 || n % be != 0)
    throw std::invalid_argument(std::string(what) + ": " + std::to_string(n) + " elements is not a multiple of " +
                                display_name(t) + "'s block of " + std::to_string(be));
}

}  // namespace

void dequantize_row(weight_type t, const void* src, float* dst, int64_t n) {
  check_length("dequantize_row", t, n);
  const auto* bytes = static_cast<const uint8_t*>(src);
  switch (t) {
    case weight_type::f32: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)); return;
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
    case weight_type::q4_0: dequantize_q4_0(src, dst, n); return;
    case weight_type::q4_1: dequantize_q4_1(src, dst, n); return;
    case weight_type::q5_0: dequantize_q5_0(src, dst, n); return;
    case weight_type::q5_1: dequantize_q5_1(src, dst, n); return;
    case weight_type::q8_0: dequantize_q8_0(src, dst, n); return;
    case weight_type::q4_k: dequantize_q4_k(src, dst, n); return;
    case weight_type::q5_k: dequantize_q5_k(src, dst, n); return;
    case weight_type::q6_k: dequantize_q6_k(src, dst, n); return;
    default: unsupported("dequantize_row", t);
  }
}

void quantize_row(weight_type t, const float* src, void* dst, int64_t n) {
  check_length("quantize_row", t, n);
  auto* out = static_cast<uint8_t*>(dst);
  switch (t) {
    case weight_type::f32: std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float)); return;
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
    case weight_type::q4_0: quantize_q4_0(src, dst, n); return;
    case weight_type::q4_1: quantize_q4_1(src, dst, n); return;
    case weight_type::q5_0: quantize_q5_0(src, dst, n); return;
    case weight_type::q5_1: quantize_q5_1(src, dst, n); return;
    case weight_type::q8_0: quantize_q8_0(src, dst, n); return;
    case weight_type::q4_k: quantize_q4_k(src, dst, n); return;
    case weight_type::q5_k: quantize_q5_k(src, dst, n); return;
    case weight_type::q6_k: quantize_q6_k(src, dst, n); return;
    default: unsupported("quantize_row", t);
  }
}

}  // namespace tandem::kernels::cpu
