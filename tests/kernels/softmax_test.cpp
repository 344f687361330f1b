#include "kernels/cpu/ops.h"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "tests/test_support.h"

using namespace tandem::kernels::cpu;

TEST_SUITE("softmax") {
  TEST_CASE("matches a double-precision reference and sums to 1") {
    std::mt19937 rng(42);
    for (int64_t n : {1, 2, 17, 256, 32000}) {
      for (float sd : {1.0f, 10.0f}) {
        CAPTURE(n);
        CAPTURE(sd);
        std::normal_distribution<float> dist(0.0f, sd);
        std::vector<float> x(static_cast<size_t>(n));
        for (auto& v : x) v = dist(rng);
        double max_v = -1e300;
        for (float v : x) max_v = std::max<double>(max_v, v);
        double sum = 0;
        std::vector<double> ref(x.size());
        for (size_t i = 0; i < x.size(); ++i) sum += ref[i] = std::exp(x[i] - max_v);
        for (auto& r : ref) r /= sum;

        auto y = x;
        softmax(y.data(), n);
        double total = 0;
        for (int64_t i = 0; i < n; ++i) {
          CHECK(y[i] == doctest::Approx(ref[i]).epsilon(1e-5).scale(1e-12));
          CHECK(y[i] >= 0.0f);
          total += y[i];
        }
        CHECK(total == doctest::Approx(1.0).epsilon(1e-5));
      }
    }
  }

  TEST_CASE("huge logits do not overflow and -inf entries get zero") {
    const float inf = std::numeric_limits<float>::infinity();
    std::vector<float> x = {1000.0f, 999.0f, -inf, 1000.0f};
    softmax(x.data(), 4);
    const double e = std::exp(-1.0);
    CHECK(x[0] == doctest::Approx(1.0 / (2.0 + e)));
    CHECK(x[1] == doctest::Approx(e / (2.0 + e)));
    CHECK(x[2] == 0.0f);
    CHECK(x[3] == x[0]);
  }

  TEST_CASE("shifting every input leaves the output unchanged") {
    std::vector<float> a = {0.5f, -1.25f, 2.0f, 0.0f};
    std::vector<float> b = {100.5f, 98.75f, 102.0f, 100.0f};
    softmax(a.data(), 4);
    softmax(b.data(), 4);
    for (int i = 0; i < 4; ++i) CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-6));
  }
}
