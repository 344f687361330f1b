#include "kernels/cpu/ops.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu/quants.h"
#include "tests/test_support.h"

using namespace tandem::kernels::cpu;

TEST_SUITE("kv_store") {
  TEST_CASE("writes rows at their position and leaves the rest alone") {
    const int64_t row = 24;  // e.g. 3 kv heads x head_dim 8
    const int64_t n_ctx = 10;
    std::mt19937 rng(5);
    std::normal_distribution<float> dist(0.0f, 2.0f);
    std::vector<float> rows(static_cast<size_t>(3 * row));
    for (auto& v : rows) v = dist(rng);

    SUBCASE("f32 copies exactly") {
      std::vector<float> cache(static_cast<size_t>(n_ctx * row), -7.0f);
      kv_store(cache.data(), kv_type::f32, 4, rows.data(), 3, row);
      for (int64_t p = 0; p < n_ctx; ++p)
        for (int64_t e = 0; e < row; ++e) {
          const float got = cache[p * row + e];
          if (p >= 4 && p < 7)
            CHECK(got == rows[(p - 4) * row + e]);
          else
            CHECK(got == -7.0f);
        }
    }
    SUBCASE("f16 rounds to the nearest f16") {
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
}
