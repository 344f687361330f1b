#include "kernels/cpu/ops.h"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops_simd.h"
#include "tests/test_support.h"
#include "tests/kernels/kernel_test_util.h"

using namespace tandem::kernels::cpu;

namespace {


// |got - exact| in units of the float spacing at the exact value (subnormal spacing below).
double ulp_error(float got, double exact) {
  const float r = static_cast<float>(exact);
  const double spacing =
      std::max(static_cast<double>(std::nextafter(std::fabs(r), std::numeric_limits<float>::infinity()) - std::fabs(r)),
               static_cast<double>(std::numeric_limits<float>::denorm_min()));
  return std::fabs(static_cast<double>(got) - exact) / spacing;
}

}  // namespace

TEST_SUITE("softmax") {
  TEST_CASE("every path matches a double-precision reference and sums to 1") {
    tandem::test::isa_guard guard;
    std::mt19937 rng(42);
    for (int64_t n : {1, 2, 7, 9, 17, 256, 1000, 32000}) {
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

        for (const isa path : tandem::test::supported_isas()) {
          CAPTURE(isa_name(path));
          set_isa(path);
          // Trailing sentinels: the vector tail must not write past n.
          auto y = x;
          y.insert(y.end(), 3, 123.0f);
          softmax(y.data(), n);
          double total = 0;
          // x - max is rounded to float before the exponential (in every path), an error of up
          // to ~1e-6 relative for sd 10; the exponentials add at most 2 ulp.
          for (int64_t i = 0; i < n; ++i) {
            CHECK(y[i] == doctest::Approx(ref[i]).epsilon(1e-5).scale(1e-12));
            CHECK(y[i] >= 0.0f);
            total += y[i];
          }
          for (int64_t i = n; i < n + 3; ++i) CHECK(y[i] == 123.0f);
          CHECK(total == doctest::Approx(1.0).epsilon(1e-5));
        }
      }
    }
  }

  TEST_CASE("huge logits do not overflow and -inf entries get zero") {
    tandem::test::isa_guard guard;
    const float inf = std::numeric_limits<float>::infinity();
    for (const isa path : tandem::test::supported_isas()) {
      CAPTURE(isa_name(path));
      set_isa(path);
      std::vector<float> x = {1000.0f, 999.0f, -inf, 1000.0f};
      softmax(x.data(), 4);
      const double e = std::exp(-1.0);
      CHECK(x[0] == doctest::Approx(1.0 / (2.0 + e)));
      CHECK(x[1] == doctest::Approx(e / (2.0 + e)));
      CHECK(x[2] == 0.0f);
      CHECK(x[3] == x[0]);
      // Nine entries: the -inf ones in the vector body and in its tail, the max in the tail.
      std::vector<float> y = {-inf, 1.0f, -inf, 0.0f, 2.0f, -inf, 1.0f, 0.5f, 3.0f};
      softmax(y.data(), 9);
      double sum = 0;
      for (float v : {1.0, 0.0, 2.0, 1.0, 0.5, 3.0}) sum += std::exp(v - 3.0);
      CHECK(y[0] == 0.0f);
      CHECK(y[2] == 0.0f);
      CHECK(y[5] == 0.0f);
      CHECK(y[8] == doctest::Approx(1.0 / sum));
      CHECK(y[1] == doctest::Approx(std::exp(-2.0) / sum));
    }
  }

  TEST_CASE("shifting every input leaves the output unchanged") {
    tandem::test::isa_guard guard;
    for (const isa path : tandem::test::supported_isas()) {
      CAPTURE(isa_name(path));
      set_isa(path);
      std::vector<float> a = {0.5f, -1.25f, 2.0f, 0.0f};
      std::vector<float> b = {100.5f, 98.75f, 102.0f, 100.0f};
      softmax(a.data(), 4);
      softmax(b.data(), 4);
      for (int i = 0; i < 4; ++i) CHECK(a[i] == doctest::Approx(b[i]).epsilon(1e-6));
    }
  }

  TEST_CASE("the vector exponential is within 2 ulp of exact over the float range") {
    if (!isa_supported(isa::avx2)) return;
    // Every 4099th float from -104 (where e^x underflows to 0) to 89 (past FLT_MAX), through
    // results in the subnormal range (x < -87.3), against e^x in double.
    std::vector<float> x;
    for (float v = -104.0f; v < 89.0f; v = std::nextafter(v + std::fabs(v) * 4099 * 0x1p-24f, 100.0f)) x.push_back(v);
    REQUIRE(x.size() > 100000);
    std::vector<float> y(x.size());
    exp_avx2(x.data(), y.data(), static_cast<int64_t>(x.size()));
    double worst = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double exact = std::exp(static_cast<double>(x[i]));
      if (exact > std::numeric_limits<float>::max()) {
        CHECK(std::isinf(y[i]));
        continue;
      }
      worst = std::max(worst, ulp_error(y[i], exact));
    }
    CHECK(worst <= 2.0);  // 0.89 ulp measured

    const float inf = std::numeric_limits<float>::infinity();
    std::vector<float> special = {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(), 88.72f, 88.73f,
                                  -87.33f, -103.9f, -200.0f, 200.0f};
    std::vector<float> e(special.size());
    exp_avx2(special.data(), e.data(), static_cast<int64_t>(special.size()));
    CHECK(e[0] == 1.0f);
    CHECK(e[1] == 1.0f);
    CHECK(e[2] == inf);
    CHECK(e[3] == 0.0f);
    CHECK(std::isnan(e[4]));
    CHECK(ulp_error(e[5], std::exp(double(special[5]))) <= 2.0);  // just below FLT_MAX
    CHECK(e[6] == inf);
    CHECK(ulp_error(e[7], std::exp(double(special[7]))) <= 2.0);  // subnormal result
    CHECK(ulp_error(e[8], std::exp(double(special[8]))) <= 2.0);
    CHECK(e[9] == 0.0f);
    CHECK(e[10] == inf);
  }
}
