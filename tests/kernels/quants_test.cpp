#include "kernels/cpu/quants.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <map>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/blocks.h"
#include "tests/kernels/kernel_test_util.h"

using namespace tandem::kernels;
using namespace tandem::kernels::cpu;

namespace {

using tandem::test::bits_of;
using tandem::test::float_of;

std::vector<float> dequantize(weight_type t, const void* src, int64_t n) {
  std::vector<float> y(static_cast<size_t>(n));
  dequantize_row(t, src, y.data(), n);
  return y;
}

// sqrt(sum (x - x')^2 / sum x^2) after a quantize -> dequantize round trip.
double round_trip_error(weight_type t, const std::vector<float>& x) {
  const auto n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> q(static_cast<size_t>(row_bytes(t, n)));
  quantize_row(t, x.data(), q.data(), n);
  const auto y = dequantize(t, q.data(), n);
  double err = 0, ref = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    err += (static_cast<double>(x[i]) - y[i]) * (static_cast<double>(x[i]) - y[i]);
    ref += static_cast<double>(x[i]) * x[i];
  }
  return std::sqrt(err / ref);
}

}  // namespace

TEST_SUITE("quants") {
  TEST_CASE("fp16 conversion") {
    SUBCASE("known values") {
      CHECK(fp32_to_fp16(1.0f) == 0x3C00);
      CHECK(fp32_to_fp16(-2.0f) == 0xC000);
      CHECK(fp32_to_fp16(0.5f) == 0x3800);
      CHECK(fp32_to_fp16(65504.0f) == 0x7BFF);  // largest finite half
      CHECK(fp32_to_fp16(65519.0f) == 0x7BFF);  // below the midpoint to 2^16
      CHECK(fp32_to_fp16(65520.0f) == 0x7C00);  // midpoint ties to even: infinity
      CHECK(fp32_to_fp16(1e9f) == 0x7C00);
      CHECK(fp32_to_fp16(-1e9f) == 0xFC00);
      CHECK(fp32_to_fp16(std::ldexp(1.0f, -14)) == 0x0400);  // smallest normal
      CHECK(fp32_to_fp16(std::ldexp(1.0f, -24)) == 0x0001);  // smallest subnormal
      CHECK(fp32_to_fp16(std::ldexp(1.0f, -25)) == 0x0000);  // half of it ties to even (0)
      CHECK(fp32_to_fp16(std::ldexp(1.5f, -25)) == 0x0001);
      CHECK(fp32_to_fp16(std::ldexp(3.0f, -25)) == 0x0002);  // 1.5 ulp ties to even (2)
      CHECK(fp32_to_fp16(-0.0f) == 0x8000);
      CHECK(fp32_to_fp16(1.0f + std::ldexp(1.0f, -11)) == 0x3C00);      // tie, even stays
      CHECK(fp32_to_fp16(1.0f + 3 * std::ldexp(1.0f, -11)) == 0x3C02);  // tie, odd rounds up
      CHECK(fp32_to_fp16(1.0f + std::ldexp(1.0f, -11) + std::ldexp(1.0f, -20)) == 0x3C01);
      const uint16_t nan = fp32_to_fp16(std::numeric_limits<float>::quiet_NaN());
      CHECK((nan & 0x7C00) == 0x7C00);
      CHECK((nan & 0x03FF) != 0);
      CHECK(fp16_to_fp32(0x3C00) == 1.0f);
      CHECK(fp16_to_fp32(0x03FF) == 1023 * std::ldexp(1.0f, -24));
      CHECK(fp16_to_fp32(0x7C00) == std::numeric_limits<float>::infinity());
      CHECK(std::isnan(fp16_to_fp32(0x7E00)));
      CHECK(bits_of(fp16_to_fp32(0x8000)) == 0x80000000u);
    }
    SUBCASE("every half survives a round trip") {
      for (uint32_t h = 0; h < 0x10000; ++h) {
        if ((h & 0x7C00) == 0x7C00 && (h & 0x3FF)) continue;  // NaN payloads are not kept
        REQUIRE(fp32_to_fp16(fp16_to_fp32(static_cast<uint16_t>(h))) == h);
      }
    }
    SUBCASE("floats round to the nearest half") {
      // No neighbour of the chosen half (one code up or down in magnitude) is closer.
      for (float x : tandem::test::gaussian(4096, 7, 100.0f)) {
        const uint16_t h = fp32_to_fp16(x);
        const double err = std::fabs(static_cast<double>(fp16_to_fp32(h)) - x);
        if ((h & 0x7FFF) != 0) REQUIRE(err <= std::fabs(static_cast<double>(fp16_to_fp32(static_cast<uint16_t>(h - 1))) - x));
        if ((h & 0x7FFF) < 0x7BFF) REQUIRE(err <= std::fabs(static_cast<double>(fp16_to_fp32(static_cast<uint16_t>(h + 1))) - x));
      }
    }
  }

  TEST_CASE("bf16 conversion") {
    CHECK(fp32_to_bf16(1.0f) == 0x3F80);
    CHECK(fp32_to_bf16(-3.0f) == 0xC040);
    CHECK(fp32_to_bf16(float_of(0x3F808000)) == 0x3F80);  // tie, even stays
    CHECK(fp32_to_bf16(float_of(0x3F818000)) == 0x3F82);  // tie, odd rounds up
    CHECK(fp32_to_bf16(float_of(0x3F808001)) == 0x3F81);
    CHECK(fp32_to_bf16(float_of(0x7F7FFFFF)) == 0x7F80);  // rounds up to infinity
    CHECK(std::isnan(bf16_to_fp32(fp32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
    CHECK(bf16_to_fp32(0x3F80) == 1.0f);
    for (uint32_t h = 0; h < 0x10000; ++h) {
      if ((h & 0x7F80) == 0x7F80 && (h & 0x7F)) continue;
      REQUIRE(fp32_to_bf16(bf16_to_fp32(static_cast<uint16_t>(h))) == h);
    }
  }

  TEST_CASE("dequantize hand-built blocks") {
    SUBCASE("F32 F16 BF16") {
      const float f[2] = {1.5f, -0.25f};
      CHECK(dequantize(weight_type::f32, f, 2) == std::vector<float>{1.5f, -0.25f});
      const uint16_t h[2] = {0x3C00, 0xC000};
      CHECK(dequantize(weight_type::f16, h, 2) == std::vector<float>{1.0f, -2.0f});
      const uint16_t b[2] = {0x3F80, 0xC040};
      CHECK(dequantize(weight_type::bf16, b, 2) == std::vector<float>{1.0f, -3.0f});
    }
    SUBCASE("Q4_0") {
      block_q4_0 b;
      store_half(b.d, 0x3800);  // 0.5
      for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
      const auto y = dequantize(weight_type::q4_0, &b, 32);
      CHECK(y[0] == -4.0f);
      CHECK(y[15] == 3.5f);
      CHECK(y[16] == 3.5f);
      CHECK(y[31] == -4.0f);
      for (int j = 0; j < 16; ++j) {
        CHECK(y[j] == 0.5f * static_cast<float>(j - 8));
        CHECK(y[j + 16] == 0.5f * static_cast<float>(7 - j));
      }
    }
    SUBCASE("Q4_1") {
      block_q4_1 b;
      store_half(b.d, 0x3400);  // 0.25
      store_half(b.m, 0xBC00);  // -1
      for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
      const auto y = dequantize(weight_type::q4_1, &b, 32);
      CHECK(y[0] == -1.0f);
      CHECK(y[15] == 2.75f);
      CHECK(y[16] == 2.75f);
      CHECK(y[31] == -1.0f);
    }
    SUBCASE("Q5_0 and Q5_1") {
      // Fifth bits set for elements 0 and 31 only.
      const uint8_t qh[4] = {0x01, 0x00, 0x00, 0x80};
      uint8_t qs[16];
      std::memset(qs, 0x88, sizeof qs);
      qs[0] = 0x23;   // element 0: 3, element 16: 2
      qs[15] = 0xF0;  // element 15: 0, element 31: 15
      block_q5_0 b0;
      store_half(b0.d, 0x3800);  // 0.5
      std::memcpy(b0.qh, qh, 4);
      std::memcpy(b0.qs, qs, 16);
      auto y = dequantize(weight_type::q5_0, &b0, 32);
      CHECK(y[0] == 1.5f);    // (3 + 16 - 16) * 0.5
      CHECK(y[16] == -7.0f);  // (2 - 16) * 0.5
      CHECK(y[15] == -8.0f);
      CHECK(y[31] == 7.5f);  // (15 + 16 - 16) * 0.5
      CHECK(y[5] == -4.0f);
      block_q5_1 b1;
      store_half(b1.d, 0x3800);
      store_half(b1.m, 0x3C00);  // 1
      std::memcpy(b1.qh, qh, 4);
      std::memcpy(b1.qs, qs, 16);
      y = dequantize(weight_type::q5_1, &b1, 32);
      CHECK(y[0] == 10.5f);  // 19 * 0.5 + 1
      CHECK(y[16] == 2.0f);
      CHECK(y[15] == 1.0f);
      CHECK(y[31] == 16.5f);
      CHECK(y[5] == 5.0f);
    }
    SUBCASE("Q8_0") {
      block_q8_0 b;
      store_half(b.d, 0x3400);  // 0.25
      for (int j = 0; j < 32; ++j) b.qs[j] = static_cast<int8_t>(j - 16);
      b.qs[0] = -128;
      const auto y = dequantize(weight_type::q8_0, &b, 32);
      CHECK(y[0] == -32.0f);
      CHECK(y[1] == -3.75f);
      CHECK(y[31] == 3.75f);
    }
    // Sub-block scales {1,2,3,4,5,6,7,63} and mins {0,1,2,3,4,5,6,40}, packed by hand into
    // the 12-byte layout (6 bits each; top bits of 4..7 in the top of bytes 0..7).
    const uint8_t k_scales[12] = {1, 2, 3, 196, 0, 1, 2, 131, 69, 86, 103, 143};
    SUBCASE("Q4_K") {
      block_q4_k b;
      store_half(b.d, 0x3C00);     // 1
      store_half(b.dmin, 0x3800);  // 0.5
      std::memcpy(b.scales, k_scales, 12);
      for (int c = 0; c < 4; ++c)
        for (int l = 0; l < 32; ++l) b.qs[32 * c + l] = static_cast<uint8_t>((l & 0xF) | (((l + c) & 0xF) << 4));
      const auto y = dequantize(weight_type::q4_k, &b, 256);
      CHECK(y[0] == 0.0f);
      CHECK(y[1] == 1.0f);
      CHECK(y[32] == -0.5f);    // scale 2 * code 0 - 0.5 * min 1
      CHECK(y[197] == 32.0f);   // sub-block 6: 7 * 5 - 0.5 * 6
      CHECK(y[255] == 106.0f);  // sub-block 7: 63 * 2 - 0.5 * 40
    }
    SUBCASE("Q5_K") {
      block_q5_k b;
      store_half(b.d, 0x3C00);
      store_half(b.dmin, 0x3800);
      std::memcpy(b.scales, k_scales, 12);
      for (int c = 0; c < 4; ++c)
        for (int l = 0; l < 32; ++l) b.qs[32 * c + l] = static_cast<uint8_t>((l & 0xF) | (((l + c) & 0xF) << 4));
      // Even l: fifth bit on the low-nibble half of every chunk; odd l: on the high half.
      for (int l = 0; l < 32; ++l) b.qh[l] = (l % 2) ? 0xAA : 0x55;
      const auto y = dequantize(weight_type::q5_k, &b, 256);
      CHECK(y[0] == 16.0f);
      CHECK(y[1] == 1.0f);
      CHECK(y[32] == -0.5f);
      CHECK(y[33] == 2.0f * 17 - 0.5f);  // odd l: fifth bit on the high half
      CHECK(y[197] == 32.0f);
      CHECK(y[255] == 1114.0f);  // 63 * (2 + 16) - 20
    }
    SUBCASE("Q6_K") {
      block_q6_k b;
      std::memset(b.ql, 0x21, sizeof b.ql);  // low nibble 1, high nibble 2
      std::memset(b.qh, 0xE4, sizeof b.qh);  // 2-bit fields 0, 1, 2, 3
      for (int s = 0; s < 16; ++s) b.scales[s] = static_cast<int8_t>(s - 8);
      store_half(b.d, 0x3800);  // 0.5
      const auto y = dequantize(weight_type::q6_k, &b, 256);
      // Codes by 32-element quarter of each half: 1-32, 17-32, 34-32, 50-32.
      const int quarter_code[4] = {-31, -15, 2, 18};
      for (int e = 0; e < 256; ++e)
        REQUIRE(y[static_cast<size_t>(e)] == 0.5f * static_cast<float>(e / 16 - 8) * static_cast<float>(quarter_code[(e % 128) / 32]));
      CHECK(y[0] == 124.0f);
      CHECK(y[40] == 45.0f);
      CHECK(y[198] == 4.0f);
      CHECK(y[255] == 63.0f);
    }
  }

  TEST_CASE("legacy quantizers follow ggml's reference formulas") {
    SUBCASE("Q4_0: signed maximum maps to code 0") {
      std::vector<float> x(32);
      for (int j = 0; j < 32; ++j) x[static_cast<size_t>(j)] = static_cast<float>(j % 16 - 8);
      block_q4_0 b;
      quantize_row(weight_type::q4_0, x.data(), &b, 32);
      CHECK(load_half(b.d) == 0x3C00);  // -8 / -8
      CHECK(b.qs[0] == 0x00);
      CHECK(b.qs[15] == 0xFF);
      CHECK(dequantize(weight_type::q4_0, &b, 32) == x);
      // A positive extreme gives a negative scale (code 0 = +16 here).
      std::fill(x.begin(), x.end(), 1.0f);
      x[5] = 16.0f;
      quantize_row(weight_type::q4_0, x.data(), &b, 32);
      CHECK(fp16_to_fp32(load_half(b.d)) == -2.0f);
      CHECK((b.qs[5] & 0xF) == 0);
      CHECK((b.qs[0] & 0xF) == 8);  // 1 / -2 + 8.5 = 8 after truncation: decodes as 0, not 1
    }
    SUBCASE("Q8_0: roundf rounds halves away from zero") {
      std::vector<float> x(32, 0.0f);
      x[0] = 127.0f;  // d = 1
      x[1] = 2.5f;
      x[2] = -2.5f;
      x[3] = 0.5f;
      x[4] = -0.5f;
      block_q8_0 b;
      quantize_row(weight_type::q8_0, x.data(), &b, 32);
      CHECK(load_half(b.d) == 0x3C00);
      CHECK(b.qs[0] == 127);
      CHECK(b.qs[1] == 3);
      CHECK(b.qs[2] == -3);
      CHECK(b.qs[3] == 1);
      CHECK(b.qs[4] == -1);
    }
    SUBCASE("Q4_1 / Q5_1: codes measured from the minimum") {
      std::vector<float> x(32);
      for (int j = 0; j < 32; ++j) x[static_cast<size_t>(j)] = 2.0f + 0.5f * static_cast<float>(j);  // 2 .. 17.5
      block_q5_1 b;
      quantize_row(weight_type::q5_1, x.data(), &b, 32);
      CHECK(fp16_to_fp32(load_half(b.m)) == 2.0f);
      CHECK(fp16_to_fp32(load_half(b.d)) == 0.5f);
      CHECK(dequantize(weight_type::q5_1, &b, 32) == x);
    }
  }

  TEST_CASE("round trip error per type") {
    // Bounds on the relative RMS error for Gaussian data, about 1.2x what these quantizers
    // measure (e.g. Q8_0 0.0053, Q6_K 0.017, Q5_K 0.036, Q4_K 0.071, Q4_0 0.084); the
    // theory for round-to-nearest is step / sqrt(12) with step = range / codes.
    const std::map<weight_type, double> bound{
        {weight_type::f32, 0.0},    {weight_type::f16, 2.5e-4}, {weight_type::bf16, 2e-3},  {weight_type::q8_0, 6.5e-3},
        {weight_type::q5_0, 0.05},  {weight_type::q5_1, 0.045}, {weight_type::q4_0, 0.1},   {weight_type::q4_1, 0.095},
        {weight_type::q6_k, 0.021}, {weight_type::q5_k, 0.043}, {weight_type::q4_k, 0.085},
    };
    for (const auto& [offset, seed] : {std::pair{0.0f, 11u}, std::pair{0.7f, 12u}}) {
      const auto x = tandem::test::gaussian(8192, seed, 0.02f, offset * 0.02f);
      for (const auto t : tandem::test::computable_types()) {
        CAPTURE(display_name(t));
        CAPTURE(offset);
        const double e = round_trip_error(t, x);
        CHECK(e <= bound.at(t));
      }
    }
  }

  TEST_CASE("K-quants are at least as good as their legacy peers") {
    const auto x = tandem::test::gaussian(8192, 21, 1.0f);
    CHECK(round_trip_error(weight_type::q4_k, x) < round_trip_error(weight_type::q4_0, x));
    CHECK(round_trip_error(weight_type::q5_k, x) < round_trip_error(weight_type::q5_0, x));
    CHECK(round_trip_error(weight_type::q6_k, x) < round_trip_error(weight_type::q5_k, x));
  }

  TEST_CASE("quantizers handle constant and zero blocks") {
    for (const auto t : tandem::test::computable_types()) {
      CAPTURE(display_name(t));
      for (float v : {0.0f, -0.75f, 3.0f}) {
        CAPTURE(v);
        const std::vector<float> x(256, v);
        std::vector<uint8_t> q(static_cast<size_t>(row_bytes(t, 256)));
        quantize_row(t, x.data(), q.data(), 256);
        const auto y = dequantize(t, q.data(), 256);
        for (float got : y) REQUIRE(std::fabs(got - v) <= 0.01f * std::fabs(v) + 1e-6f);
      }
    }
  }

  TEST_CASE("quantize is deterministic") {
    const auto x = tandem::test::gaussian(1024, 5);
    for (const auto t : tandem::test::computable_types()) {
      CAPTURE(display_name(t));
      const auto a = tandem::test::quantize_matrix(t, x, 1, 1024);
      const auto b = tandem::test::quantize_matrix(t, x, 1, 1024);
      CHECK(a == b);
    }
  }

  TEST_CASE("bad arguments name the type") {
    std::vector<float> x(256);
    std::vector<uint8_t> q(1024);
    CHECK_THROWS_WITH_AS(quantize_row(weight_type::q2_k, x.data(), q.data(), 256), doctest::Contains("Q2_K"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(dequantize_row(weight_type::iq4_xs, q.data(), x.data(), 256), doctest::Contains("IQ4_XS"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(quantize_row(weight_type::q4_k, x.data(), q.data(), 100), doctest::Contains("Q4_K"), std::invalid_argument);
  }
}
