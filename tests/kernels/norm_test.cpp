#include "kernels/cpu/ops.h"

#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/isa.h"
#include "tests/test_support.h"
#include "tests/kernels/kernel_test_util.h"

using namespace tandem::kernels::cpu;

namespace {

std::vector<float> random_vector(std::mt19937& rng, int64_t n, float sd) {
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

std::vector<double> reference_rms_norm(const std::vector<float>& x, const float* w, float eps) {
  double ss = 0;
  for (float v : x) ss += static_cast<double>(v) * v;
  const double inv = 1.0 / std::sqrt(ss / static_cast<double>(x.size()) + eps);
  std::vector<double> out(x.size());
  for (size_t i = 0; i < x.size(); ++i) out[i] = x[i] * inv * (w ? w[i] : 1.0);
  return out;
}


}  // namespace

TEST_SUITE("norm") {
  TEST_CASE("rms_norm matches a double-precision reference on every path") {
    tandem::test::isa_guard guard;
    std::mt19937 rng(1234);
    for (int64_t n : {1, 7, 8, 9, 64, 100, 576, 4096, 4099}) {
      CAPTURE(n);
      const auto x = random_vector(rng, n, 3.0f);
      const auto w = random_vector(rng, n, 1.0f);
      const float eps = 1e-5f;
      const auto ref_w = reference_rms_norm(x, w.data(), eps);
      const auto ref = reference_rms_norm(x, nullptr, eps);
      std::vector<float> scalar_out;
      for (const isa path : tandem::test::supported_isas()) {
        CAPTURE(isa_name(path));
        set_isa(path);
        // With weight; the tail beyond n must stay untouched.
        std::vector<float> out(x.size() + 3, -5.0f);
        rms_norm(x.data(), w.data(), out.data(), n, eps);
        for (int64_t i = 0; i < n; ++i) CHECK(out[i] == doctest::Approx(ref_w[i]).epsilon(1e-5));
        for (int64_t i = n; i < n + 3; ++i) CHECK(out[i] == -5.0f);
        // The paths differ only in the order of the double sum of squares, far below float
        // resolution: the float results agree to an ulp.
        if (path == isa::scalar) scalar_out = out;
        for (int64_t i = 0; i < n; ++i) CHECK(out[i] == doctest::Approx(scalar_out[i]).epsilon(2.5e-7));
        // Without weight, in place.
        auto y = x;
        rms_norm(y.data(), nullptr, y.data(), n, eps);
        for (int64_t i = 0; i < n; ++i) CHECK(y[i] == doctest::Approx(ref[i]).epsilon(1e-5));
      }
    }
  }

  TEST_CASE("unweighted output has unit mean square and eps guards zero input") {
    tandem::test::isa_guard guard;
    for (const isa path : tandem::test::supported_isas()) {
      CAPTURE(isa_name(path));
      set_isa(path);
      std::mt19937 rng(99);
      const auto x = random_vector(rng, 1000, 50.0f);
      std::vector<float> out(x.size());
      rms_norm(x.data(), nullptr, out.data(), 1000, 1e-6f);
      double ms = 0;
      for (float v : out) ms += static_cast<double>(v) * v;
      CHECK(ms / 1000.0 == doctest::Approx(1.0).epsilon(1e-5));

      std::vector<float> zeros(16, 0.0f), z_out(16, 1.0f);
      rms_norm(zeros.data(), nullptr, z_out.data(), 16, 1e-6f);
      for (float v : z_out) CHECK(v == 0.0f);
    }
  }
}
