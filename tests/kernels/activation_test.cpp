#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_pool.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
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

TEST_SUITE("activation") {
  TEST_CASE("swiglu_fast stays within a few ulp of swiglu and saturates the same way") {
    std::mt19937 rng(11);
    std::normal_distribution<float> dist(0.0f, 4.0f);
    const int64_t n = 4099;  // a tail after the full vectors
    std::vector<float> g(static_cast<size_t>(n)), u(static_cast<size_t>(n));
    for (auto& v : g) v = dist(rng);
    for (auto& v : u) v = dist(rng);
    auto exact = g, fast = g;
    swiglu(exact.data(), u.data(), n);
    swiglu_fast(fast.data(), u.data(), n, nullptr);
    for (int64_t i = 0; i < n; ++i) {
      CAPTURE(g[i]);
      // e^x within 2 ulp moves silu(g) * u by a few float ulps of the result.
      CHECK(fast[i] == doctest::Approx(exact[i]).epsilon(1e-6).scale(1e-30));
    }
    std::vector<float> s = {-200.0f, -90.0f, 0.0f, 90.0f, 200.0f};
    const std::vector<float> three(5, 3.0f);
    auto want = s;
    swiglu(want.data(), three.data(), 5);
    swiglu_fast(s.data(), three.data(), 5, nullptr);
    for (size_t i = 0; i < s.size(); ++i) {
      CAPTURE(i);
      CHECK(std::isfinite(s[i]));
      CHECK(s[i] == doctest::Approx(want[i]));
      CHECK(std::signbit(s[i]) == std::signbit(want[i]));  // -0 below, as the scalar op gives
    }
  }

  TEST_CASE("swiglu_fast gives each element the same bits wherever it lies and however the call is split") {
    tandem::kernels::cpu::thread_pool pool(3);
    const int64_t n = 70001;  // several pool pieces and a tail
    std::vector<float> g(static_cast<size_t>(n)), u(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      g[static_cast<size_t>(i)] = static_cast<float>((i * 37) % 2001 - 1000) / 50.0f;
      u[static_cast<size_t>(i)] = static_cast<float>((i * 11) % 17 - 8) / 4.0f;
    }
    auto whole = g, pooled = g;
    swiglu_fast(whole.data(), u.data(), n, nullptr);
    swiglu_fast(pooled.data(), u.data(), n, &pool);
    CHECK(whole == pooled);
    // Element by element (each a one-lane tail), and in odd-sized pieces.
    bool same = true;
    for (int64_t i = 0; i < n; i += 997) {
      float one = g[static_cast<size_t>(i)];
      swiglu_fast(&one, &u[static_cast<size_t>(i)], 1, nullptr);
      same = same && std::memcmp(&one, &whole[static_cast<size_t>(i)], sizeof one) == 0;
    }
    CHECK(same);
    auto pieces = g;
    for (int64_t b = 0; b < n; b += 13) swiglu_fast(pieces.data() + b, u.data() + b, std::min<int64_t>(13, n - b), nullptr);
    CHECK(pieces == whole);
  }
}
