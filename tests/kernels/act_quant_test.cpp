#include "kernels/cpu/act_quant.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/blocks.h"
#include "kernels/cpu/quants.h"
#include "tests/kernels/kernel_test_util.h"

using namespace tandem::kernels;
using namespace tandem::kernels::cpu;

TEST_SUITE("act_quant") {
  TEST_CASE("activation type per weight type (ggml's vec_dot_type)") {
    CHECK(activation_type(weight_type::q4_0) == weight_type::q8_0);
    CHECK(activation_type(weight_type::q5_0) == weight_type::q8_0);
    CHECK(activation_type(weight_type::q8_0) == weight_type::q8_0);
    CHECK(activation_type(weight_type::q4_1) == weight_type::q8_1);
    CHECK(activation_type(weight_type::q5_1) == weight_type::q8_1);
    CHECK(activation_type(weight_type::q4_k) == weight_type::q8_k);
    CHECK(activation_type(weight_type::q5_k) == weight_type::q8_k);
    CHECK(activation_type(weight_type::q6_k) == weight_type::q8_k);
    CHECK(activation_type(weight_type::f16) == weight_type::f16);
    CHECK(activation_type(weight_type::bf16) == weight_type::bf16);
    CHECK(activation_type(weight_type::f32) == weight_type::f32);
    CHECK_THROWS_WITH_AS(activation_type(weight_type::q3_k), doctest::Contains("Q3_K"), std::invalid_argument);
  }

  TEST_CASE("Q8_0: d = amax / 127, x * (127 / amax) rounds half to even (llama.cpp's x86 path)") {
    std::vector<float> x(32, 0.0f);
    x[0] = -254.0f;  // d = 2, id = 0.5
    x[1] = 5.0f;     // 2.5 -> 2
    x[2] = -5.0f;    // -2.5 -> -2
    x[3] = 1.0f;     // 0.5 -> 0
    x[5] = 7.0f;     // 3.5 -> 4
    block_q8_0 b;
    quantize_activation_row(weight_type::q8_0, x.data(), &b, 32);
    CHECK(load_half(b.d) == 0x4000);
    CHECK(b.qs[0] == -127);
    CHECK(b.qs[1] == 2);
    CHECK(b.qs[2] == -2);
    CHECK(b.qs[3] == 0);
    CHECK(b.qs[4] == 0);
    CHECK(b.qs[5] == 4);
  }

  TEST_CASE("Q8_1: s = d * sum of codes") {
    const auto x = tandem::test::gaussian(64, 3);
    block_q8_1 b[2];
    quantize_activation_row(weight_type::q8_1, x.data(), b, 64);
    for (int i = 0; i < 2; ++i) {
      const float* xb = x.data() + 32 * i;
      float amax = 0;
      for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(xb[j]));
      const float d = amax / 127;
      int sum = 0;
      for (int j = 0; j < 32; ++j) {
        CHECK(b[i].qs[j] == static_cast<int>(std::nearbyint(xb[j] * (127.0f / amax))));
        sum += b[i].qs[j];
      }
      CHECK(load_half(b[i].d) == fp32_to_fp16(d));
      CHECK(load_half(b[i].s) == fp32_to_fp16(static_cast<float>(sum) * d));
    }
    // Same codes and d as Q8_0 for the same data.
    block_q8_0 c[2];
    quantize_activation_row(weight_type::q8_0, x.data(), c, 64);
    for (int i = 0; i < 2; ++i) {
      CHECK(load_half(c[i].d) == load_half(b[i].d));
      for (int j = 0; j < 32; ++j) CHECK(c[i].qs[j] == b[i].qs[j]);
    }
  }

  TEST_CASE("Q8_K: signed maximum maps to -127, codes round half to even, bsums") {
    std::vector<float> x(256, 0.0f);
    x[0] = -127.0f;  // iscale = 1
    x[1] = 0.5f;     // -> 0
    x[2] = 1.5f;     // -> 2
    x[3] = 2.5f;     // -> 2
    x[4] = -3.5f;    // -> -4
    x[20] = 100.0f;
    block_q8_k b;
    quantize_activation_row(weight_type::q8_k, x.data(), &b, 256);
    CHECK(b.d == 1.0f);
    CHECK(b.qs[0] == -127);
    CHECK(b.qs[1] == 0);
    CHECK(b.qs[2] == 2);
    CHECK(b.qs[3] == 2);
    CHECK(b.qs[4] == -4);
    CHECK(b.qs[20] == 100);
    CHECK(b.bsums[0] == -127 + 2 + 2 - 4);
    CHECK(b.bsums[1] == 100);
    for (int g = 2; g < 16; ++g) CHECK(b.bsums[g] == 0);

    // Negated data: the extreme is now positive, so iscale and d flip sign and the codes
    // come out the same as before.
    for (auto& v : x) v = -v;
    block_q8_k neg;
    quantize_activation_row(weight_type::q8_k, x.data(), &neg, 256);
    CHECK(neg.d == -1.0f);
    for (int j = 0; j < 256; ++j) REQUIRE(neg.qs[j] == b.qs[j]);

    std::fill(x.begin(), x.end(), 0.0f);
    quantize_activation_row(weight_type::q8_k, x.data(), &b, 256);
    CHECK(b.d == 0.0f);
    for (int g = 0; g < 16; ++g) CHECK(b.bsums[g] == 0);
  }

  TEST_CASE("round trip through every activation type") {
    const auto x = tandem::test::gaussian(512, 9);
    for (const auto act : {weight_type::q8_0, weight_type::q8_1, weight_type::q8_k, weight_type::f16, weight_type::bf16, weight_type::f32}) {
      CAPTURE(display_name(act));
      std::vector<uint8_t> q(static_cast<size_t>(row_bytes(act, 512)));
      quantize_activation_row(act, x.data(), q.data(), 512);
      std::vector<float> y(512);
      dequantize_activation_row(act, q.data(), y.data(), 512);
      const int64_t block = info(act).block_elems;
      for (int64_t b0 = 0; b0 < 512; b0 += std::max<int64_t>(block, 32)) {
        const int64_t len = std::max<int64_t>(block, 32);
        float amax = 0;
        for (int64_t i = b0; i < b0 + len; ++i) amax = std::max(amax, std::fabs(x[static_cast<size_t>(i)]));
        for (int64_t i = b0; i < b0 + len; ++i) {
          const float xi = x[static_cast<size_t>(i)], yi = y[static_cast<size_t>(i)];
          // Half a step of the block's 8-bit grid (plus the fp16 rounding of d), or the
          // element's own relative rounding for the float formats.
          float tol = 0;
          if (act == weight_type::f16)
            tol = std::fabs(xi) * 4.9e-4f;
          else if (act == weight_type::bf16)
            tol = std::fabs(xi) * 3.91e-3f;
          else if (act != weight_type::f32)
            tol = amax * 0.0045f;
          REQUIRE(std::fabs(yi - xi) <= tol);
        }
      }
    }
  }

  TEST_CASE("the AVX-512 and AVX2 quantizers write the scalar ones' bytes") {
    tandem::test::isa_guard guard;
    for (const weight_type act : {weight_type::q8_0, weight_type::q8_1, weight_type::q8_k}) {
      for (const int64_t n : {int64_t{256}, int64_t{1024}}) {
        CAPTURE(display_name(act));
        // Gaussian data, plus ties at the extremes (+a and -a) and exact .5 steps.
        auto x = tandem::test::gaussian(static_cast<size_t>(n), static_cast<uint32_t>(n + 3), 2.0f);
        x[3] = 4.0f;
        x[40] = -4.0f;
        x[300 % n] = 0.0f;
        for (int64_t j = 512 % n; j < 512 % n + 32; ++j) x[static_cast<size_t>(j)] = 0.0f;  // an all-zero block
        std::vector<float> halves(static_cast<size_t>(n));
        for (int64_t j = 0; j < n; ++j) halves[static_cast<size_t>(j)] = 0.5f * static_cast<float>(j % 255 - 127);
        // Scales an f16 cannot hold as normals: subnormal (amax / 127 below 2^-14), rounded
        // to zero, and overflowing to infinity (amax / 127 from 65520 up).
        auto scaled = [&](float k) {
          auto y = x;
          for (auto& v : y) v *= k;
          return y;
        };
        // The extreme magnitude twice in one block, negative first: Q8_K takes the first one's
        // sign (so its codes and d flip with it), Q8_0/Q8_1 only the magnitude.
        auto ties = x;
        for (auto& v : ties) v = std::clamp(v, -4.9f, 4.9f);
        ties[2] = -5.0f;
        ties[7] = 5.0f;
        ties[100 % n] = 5.0f;
        for (const auto& data : {x, halves, ties, scaled(1e-4f), scaled(1e-7f), scaled(1e-9f), scaled(1e7f)}) {
          const size_t bytes = static_cast<size_t>(row_bytes(act, n));
          std::vector<uint8_t> a(bytes, 0xEE), b(bytes, 0x11);
          set_isa(isa::scalar);
          quantize_activation_row(act, data.data(), a.data(), n);
          for (const isa path : {isa::avx2, isa::avx512}) {
            if (!isa_supported(path)) continue;
            CAPTURE(isa_name(path));
            std::fill(b.begin(), b.end(), uint8_t{0x11});
            set_isa(path);
            quantize_activation_row(act, data.data(), b.data(), n);
            CHECK(a == b);
          }
        }
      }
    }
  }

  TEST_CASE("only activation types are accepted") {
    std::vector<float> x(256);
    std::vector<uint8_t> q(1024);
    CHECK_THROWS_WITH_AS(quantize_activation_row(weight_type::q4_0, x.data(), q.data(), 256), doctest::Contains("Q4_0"), std::invalid_argument);
  }
}
