#include "kernels/cpu/ops.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/quants.h"
#include "tests/test_support.h"
#include "tests/kernels/kernel_test_util.h"

using namespace tandem::kernels::cpu;

namespace {


using tandem::test::float_of;

}  // namespace

TEST_SUITE("kv_store") {
  TEST_CASE("writes rows at their position and leaves the rest alone") {
    tandem::test::isa_guard guard;
    const int64_t row = 24;  // e.g. 3 kv heads x head_dim 8
    const int64_t n_ctx = 10;
    std::mt19937 rng(5);
    std::normal_distribution<float> dist(0.0f, 2.0f);
    std::vector<float> rows(static_cast<size_t>(3 * row));
    for (auto& v : rows) v = dist(rng);

    for (const isa path : tandem::test::supported_isas()) {
      CAPTURE(isa_name(path));
      set_isa(path);
      // f32 copies exactly.
      std::vector<float> cache32(static_cast<size_t>(n_ctx * row), -7.0f);
      kv_store(cache32.data(), kv_type::f32, 4, rows.data(), 3, row);
      for (int64_t p = 0; p < n_ctx; ++p)
        for (int64_t e = 0; e < row; ++e) {
          const float got = cache32[p * row + e];
          if (p >= 4 && p < 7)
            CHECK(got == rows[(p - 4) * row + e]);
          else
            CHECK(got == -7.0f);
        }

      // f16 rounds to the nearest f16.
      const uint16_t sentinel = 0x7bff;
      std::vector<uint16_t> cache(static_cast<size_t>(n_ctx * row), sentinel);
      kv_store(cache.data(), kv_type::f16, 7, rows.data(), 3, row);
      for (int64_t p = 0; p < n_ctx; ++p)
        for (int64_t e = 0; e < row; ++e) {
          const uint16_t got = cache[p * row + e];
          if (p < 7) {
            CHECK(got == sentinel);
            continue;
          }
          const float x = rows[(p - 7) * row + e];
          const float back = fp16_to_fp32(got);
          // Nearest: no neighbouring f16 value is closer to x.
          const float below = fp16_to_fp32(static_cast<uint16_t>(got - 1));
          const float above = fp16_to_fp32(static_cast<uint16_t>(got + 1));
          CHECK(std::fabs(back - x) <= std::fabs(below - x));
          CHECK(std::fabs(back - x) <= std::fabs(above - x));
          CHECK(std::fabs(back - x) <= std::fabs(x) * (1.0f / 2048.0f));
        }
    }
  }

  TEST_CASE("every path converts to f16 with the bits of the scalar reference") {
    // Random values over the whole f16 range and beyond, plus the edge cases of the rounding:
    // ties between neighbours (both parities), the overflow threshold 65520 and its
    // neighbours, f16 subnormals and the underflow threshold 2^-25, zeros and infinities.
    tandem::test::isa_guard guard;
    std::mt19937 rng(99);
    std::uniform_real_distribution<float> mant(1.0f, 2.0f);
    std::uniform_int_distribution<int> expo(-30, 17);
    std::vector<float> x;
    for (int i = 0; i < 5000; ++i) x.push_back((i % 2 ? -1.0f : 1.0f) * std::ldexp(mant(rng), expo(rng)));
    const float inf = std::numeric_limits<float>::infinity();
    for (float v : {0.0f, -0.0f, inf, -inf, 65504.0f, 65519.996f, 65520.0f, 65536.0f, 1e9f, -65520.0f,
                    std::ldexp(1.0f, -14), std::ldexp(1.0f, -24), std::ldexp(1.0f, -25), std::ldexp(1.5f, -25),
                    std::ldexp(1.0f, -26), std::ldexp(3.0f, -25), std::ldexp(1.0f, -20) * 1.3f})
      x.push_back(v);
    for (uint32_t h = 0x3c00; h < 0x3c40; ++h) {
      // Exactly halfway between f16 h and h+1: ties to the even one.
      const float lo = fp16_to_fp32(static_cast<uint16_t>(h)), hi = fp16_to_fp32(static_cast<uint16_t>(h + 1));
      x.push_back((lo + hi) / 2);
      x.push_back(-(lo + hi) / 2);
    }
    x.push_back(float_of(0x387fe000u));  // halfway below the smallest normal f16, 2^-14
    // Every length up to 40 covers each vector tail; the rows start at unaligned offsets.
    for (int64_t n = 1; n <= 40; ++n)
      for (size_t start = 0; start + size_t(n) <= x.size(); start += 97) {
        std::vector<uint16_t> want(static_cast<size_t>(n)), got(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) want[size_t(i)] = fp32_to_fp16(x[start + size_t(i)]);
        for (const isa path : tandem::test::supported_isas()) {
          CAPTURE(isa_name(path));
          CAPTURE(n);
          set_isa(path);
          kv_store(got.data(), kv_type::f16, 0, x.data() + start, 1, n);
          CHECK(got == want);
        }
      }
    // The tail of x, where the edge cases sit, in one row.
    const int64_t tail = 200;
    const float* last = x.data() + x.size() - tail;
    std::vector<uint16_t> want(tail), got(tail);
    for (int64_t i = 0; i < tail; ++i) want[size_t(i)] = fp32_to_fp16(last[i]);
    for (const isa path : tandem::test::supported_isas()) {
      CAPTURE(isa_name(path));
      set_isa(path);
      kv_store(got.data(), kv_type::f16, 0, last, 1, tail);
      CHECK(got == want);
    }
  }
}
