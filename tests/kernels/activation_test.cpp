#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_pool.h"

#include <doctest/doctest.h>

#include <cmath>
#include <random>
#include <vector>

#include "tests/test_support.h"

using namespace tandem::kernels::cpu;

TEST_SUITE("activation") {
  TEST_CASE("swiglu matches silu(g) * u in double precision") {
    std::mt19937 rng(7);
    std::normal_distribution<float> dist(0.0f, 4.0f);
    for (int64_t n : {1, 5, 64, 1536}) {
      CAPTURE(n);
      std::vector<float> g(static_cast<size_t>(n)), u(static_cast<size_t>(n));
      for (auto& v : g) v = dist(rng);
      for (auto& v : u) v = dist(rng);
      auto out = g;
      swiglu(out.data(), u.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        const double gd = g[i];
        const double ref = gd / (1.0 + std::exp(-gd)) * u[i];
        CHECK(out[i] == doctest::Approx(ref).epsilon(1e-5).scale(1e-6));
      }
    }
  }

  TEST_CASE("saturates cleanly at large |gate|") {
    std::vector<float> g = {-200.0f, -90.0f, 0.0f, 90.0f, 200.0f};
    std::vector<float> u = {3.0f, 3.0f, 3.0f, 3.0f, 3.0f};
    swiglu(g.data(), u.data(), 5);
    for (float v : g) CHECK(std::isfinite(v));
    CHECK(std::fabs(g[0]) < 1e-30f);
    CHECK(std::fabs(g[1]) < 1e-30f);
    CHECK(g[2] == 0.0f);
    CHECK(g[3] == doctest::Approx(270.0));
    CHECK(g[4] == doctest::Approx(600.0));
  }
}

TEST_CASE("swiglu on a pool equals the single-threaded result bit for bit") {
  tandem::kernels::cpu::thread_pool pool(3);
  for (const int64_t n : {int64_t{100}, int64_t{8191}, int64_t{8192}, int64_t{45000}}) {
    CAPTURE(n);
    std::vector<float> g(static_cast<size_t>(n)), u(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      g[static_cast<size_t>(i)] = static_cast<float>((i * 37) % 201 - 100) / 10.0f;
      u[static_cast<size_t>(i)] = static_cast<float>((i * 11) % 17 - 8) / 4.0f;
    }
    std::vector<float> a = g, b = g;
    tandem::kernels::cpu::swiglu(a.data(), u.data(), n);
    tandem::kernels::cpu::swiglu(b.data(), u.data(), n, &pool);
    CHECK(a == b);
  }
}
