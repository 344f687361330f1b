// The SIMD forms of the element-wise ops (kernels/cpu/ops_simd.h: ops_avx2.cpp, ops_avx512.cpp)
// whose contract is the C library's expf itself: expf_exact, and SwiGLU through it.
#include "kernels/cpu/ops_simd.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <iterator>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/test_support.h"

using namespace tandem::kernels::cpu;

// The AVX2 and AVX-512 forms of the ops whose contract is expf itself (kernels/cpu/
// ops_avx2.cpp, ops_avx512.cpp, through avx2::expf_exact and avx512::expf_exact): they must
// give std::exp's bits, not an approximation of them. On this project's machines every float
// in [-104, 89] was compared once (2.2e9 values, none differed, for either form); here a stride
// of them, the edges of the vector range, and the specials, for each form the CPU can run.
namespace {

using tandem::test::bits_of;
using tandem::test::float_of;

struct exact_form {
  const char* name;
  isa path;
  void (*expf_rows)(const float*, float*, int64_t);
};
const exact_form k_forms[] = {{"avx2", isa::avx2, expf_exact_avx2}, {"avx512", isa::avx512, expf_exact_avx512}};

// Same bits, or both NaN (a NaN's payload is not part of any contract here).
bool same(float a, float b) { return bits_of(a) == bits_of(b) || (std::isnan(a) && std::isnan(b)); }

// Count of x whose form differs from std::exp; reports the first few.
int mismatches(const exact_form& f, const std::vector<float>& x) {
  std::vector<float> y(x.size());
  f.expf_rows(x.data(), y.data(), static_cast<int64_t>(x.size()));
  int bad = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const float want = std::exp(x[i]);
    if (same(y[i], want)) continue;
    if (++bad <= 5) MESSAGE("expf(" << x[i] << ", bits " << bits_of(x[i]) << "): want bits " << bits_of(want) << ", got " << bits_of(y[i]));
  }
  return bad;
}

// Runs check(form) for each form this CPU supports, naming the others as skipped.
template <class F>
void each_form(F&& check) {
  for (const exact_form& f : k_forms) {
    CAPTURE(f.name);
    if (!isa_supported(f.path)) {
      MESSAGE("skipped " << f.name << ": this CPU cannot run it");
      continue;
    }
    check(f);
  }
}

}  // namespace

TEST_SUITE("expf_exact") {
  TEST_CASE("expf_exact equals std::exp on a stride of every float in [-104, 89]") {
    // By bit pattern: the negative floats down to -104 (results down to 0 through the
    // subnormals) and the positive ones up to 89 (past the overflow to inf). An odd stride
    // visits every low-bit pattern of the mantissa, near-midpoint cases among them.
    std::vector<float> x;
    for (uint64_t u = 0x80000000u; u < 0xC2D00000u; u += 2039) x.push_back(float_of(static_cast<uint32_t>(u)));
    for (uint64_t u = 0; u < 0x42B20000u; u += 2039) x.push_back(float_of(static_cast<uint32_t>(u)));
    CHECK(x.size() > 1000000);
    each_form([&](const exact_form& f) { CHECK(mismatches(f, x) == 0); });
  }

  TEST_CASE("expf_exact at the edges of its vector range, the specials, and any length") {
    const float inf = std::numeric_limits<float>::infinity();
    std::vector<float> x = {0.0f,
                            -0.0f,
                            inf,
                            -inf,
                            std::numeric_limits<float>::quiet_NaN(),
                            -87.0f,
                            88.0f,
                            std::nextafter(-87.0f, -inf),
                            std::nextafter(88.0f, inf),
                            -103.9f,
                            -104.0f,
                            88.72f,
                            89.0f,
                            1e-30f,
                            -1e-30f,
                            std::numeric_limits<float>::denorm_min(),
                            0.5f,
                            -0.5f,
                            1.0f,
                            -1.0f};
    std::mt19937 rng(11);
    std::uniform_real_distribution<float> d(-30.0f, 5.0f);
    for (int i = 0; i < 77; ++i) x.push_back(d(rng));
    each_form([&](const exact_form& f) {
      // Every length up to two vectors and a tail, so that the scalar tail is covered too.
      for (size_t n = 0; n <= x.size(); n += (n < 40 ? 1 : 13)) {
        CAPTURE(n);
        CHECK(mismatches(f, std::vector<float>(x.begin(), x.begin() + static_cast<std::ptrdiff_t>(n))) == 0);
      }
      // In place.
      auto y = x;
      f.expf_rows(y.data(), y.data(), static_cast<int64_t>(y.size()));
      for (size_t i = 0; i < x.size(); ++i) CHECK(same(y[i], std::exp(x[i])));
    });
  }

  TEST_CASE("swiglu on the avx2 and avx512 paths equals the scalar reference bit for bit") {
    tandem::test::isa_guard guard;
    std::mt19937 rng(5);
    std::normal_distribution<float> dist(0.0f, 6.0f);
    each_form([&](const exact_form& f) {
      for (int64_t n : {1, 7, 8, 9, 15, 16, 17, 100, 1536}) {
        CAPTURE(n);
        std::vector<float> g(static_cast<size_t>(n)), u(static_cast<size_t>(n));
        for (auto& v : g) v = dist(rng);
        for (auto& v : u) v = dist(rng);
        // Saturation and the specials where they fit.
        const float specials[] = {-200.0f, -90.0f, 90.0f, 200.0f, std::numeric_limits<float>::quiet_NaN(), -0.0f};
        for (size_t i = 0; i < std::size(specials) && i * 3 < g.size(); ++i) g[i * 3] = specials[i];
        auto want = g, got = g;
        set_isa(isa::scalar);
        swiglu(want.data(), u.data(), n);
        set_isa(f.path);
        swiglu(got.data(), u.data(), n);
        for (int64_t i = 0; i < n; ++i) {
          CAPTURE(i);
          CHECK(same(got[i], want[i]));
        }
      }
    });
  }
}
