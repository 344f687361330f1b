// The element-wise ops of kernels/cpu/ops.cpp and their AVX2 / AVX-512 forms (ops_avx2.cpp,
// ops_avx512.cpp): RMSNorm, RoPE, softmax, SwiGLU and the KV store. (The SIMD forms whose
// contract is the C library's expf: ops_simd_test.cpp; attention: attention_test.cpp.)
#include "kernels/cpu/ops.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <numbers>
#include <random>
#include <vector>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops_simd.h"
#include "kernels/cpu/quants.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/test_support.h"

using namespace tandem::kernels::cpu;

namespace {

// n samples of N(0, sd^2).
std::vector<float> random_vector(std::mt19937& rng, int64_t n, float sd = 1.0f) {
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

namespace {

// Straightforward double-precision RoPE from the published formulas (RoFormer; YaRN paper
// and ggml's rope_yarn for the ramp between the correction dims and the magnitude scale).
std::vector<double> reference_rope(const std::vector<float>& x, int n_heads, int head_dim, int64_t pos, const rope_params& p) {
  const int n_rot = p.n_rot > 0 ? p.n_rot : head_dim;
  const int half = n_rot / 2;
  double low = 0, high = 0;
  double mscale = p.attn_factor;
  if (p.ext_factor != 0.0f) {
    auto corr_dim = [&](double turns) {
      return n_rot * std::log(p.n_ctx_orig / (turns * 2.0 * std::numbers::pi)) / (2.0 * std::log(double(p.freq_base)));
    };
    low = std::max(0.0, std::floor(corr_dim(p.beta_fast)));
    high = std::min(double(n_rot - 1), std::ceil(corr_dim(p.beta_slow)));
    mscale *= 1.0 + 0.1 * std::log(1.0 / p.freq_scale);
  }
  std::vector<double> out(x.begin(), x.end());
  for (int h = 0; h < n_heads; ++h) {
    for (int i = 0; i < half; ++i) {
      double theta = double(pos) * std::pow(double(p.freq_base), -2.0 * i / n_rot);
      if (p.freq_factors) theta /= p.freq_factors[i];
      double angle = theta * p.freq_scale;
      if (p.ext_factor != 0.0f) {
        const double y = (i - low) / std::max(0.001, high - low);
        const double mix = (1.0 - std::clamp(y, 0.0, 1.0)) * p.ext_factor;
        angle = angle * (1.0 - mix) + theta * mix;
      }
      const int a = h * head_dim + (p.pairing == rope_pairing::adjacent ? 2 * i : i);
      const int b = a + (p.pairing == rope_pairing::adjacent ? 1 : half);
      const double c = std::cos(angle) * mscale, s = std::sin(angle) * mscale;
      out[a] = x[a] * c - x[b] * s;
      out[b] = x[a] * s + x[b] * c;
    }
  }
  return out;
}

// Compares against the reference. Angles are float in the kernel (as in ggml), so the
// absolute error grows with the position: ~1e-7 * pos radians.
void check_against_reference(std::mt19937& rng, int n_heads, int head_dim, const rope_params& p) {
  for (int64_t pos : {0, 1, 17, 300, 4000}) {
    CAPTURE(pos);
    const auto x = random_vector(rng, size_t(n_heads) * head_dim);
    auto y = x;
    rope(y.data(), n_heads, head_dim, pos, p);
    const auto ref = reference_rope(x, n_heads, head_dim, pos, p);
    const double tol = 1e-5 + 1e-6 * double(pos);
    double worst = 0;
    for (size_t i = 0; i < y.size(); ++i) worst = std::max(worst, std::fabs(y[i] - ref[i]));
    CHECK(worst <= tol);
  }
}

}  // namespace

TEST_SUITE("rope") {
  TEST_CASE("matches a double-precision reference") {
    std::mt19937 rng(2024);
    for (auto pairing : {rope_pairing::adjacent, rope_pairing::neox}) {
      CAPTURE(int(pairing));
      rope_params p;
      p.pairing = pairing;
      SUBCASE("full rotation, base 10000") {
        p.n_rot = 64;
        check_against_reference(rng, 3, 64, p);
      }
      SUBCASE("partial rotation passes the tail through") {
        p.n_rot = 32;
        p.freq_base = 1e6f;
        check_against_reference(rng, 2, 80, p);
        const auto x = random_vector(rng, 2 * 80);
        auto y = x;
        rope(y.data(), 2, 80, 1234, p);
        for (int h = 0; h < 2; ++h)
          for (int d = 32; d < 80; ++d) CHECK(y[h * 80 + d] == x[h * 80 + d]);
      }
      SUBCASE("n_rot 0 rotates the whole head") {
        rope_params full = p;
        full.n_rot = 16;
        const auto x = random_vector(rng, 4 * 16);
        auto a = x, b = x;
        rope(a.data(), 4, 16, 77, p);
        rope(b.data(), 4, 16, 77, full);
        CHECK(a == b);
      }
      SUBCASE("linear scaling") {
        p.n_rot = 64;
        p.freq_scale = 0.25f;
        check_against_reference(rng, 2, 64, p);
      }
      SUBCASE("llama3 freq_factors") {
        p.n_rot = 64;
        p.freq_base = 500000.0f;
        std::vector<float> ff(32);
        for (int i = 0; i < 32; ++i) ff[i] = 1.0f + 7.0f * float(i) / 31.0f;  // 1 .. 8 like llama3
        p.freq_factors = ff.data();
        check_against_reference(rng, 2, 64, p);
      }
      SUBCASE("yarn") {
        p.n_rot = 64;
        p.freq_scale = 0.25f;
        p.n_ctx_orig = 4096;  // correction dims 10 .. 23: a real ramp, not near an integer
        p.ext_factor = 1.0f;
        check_against_reference(rng, 2, 64, p);
        p.ext_factor = 0.5f;
        p.attn_factor = 0.9f;
        check_against_reference(rng, 2, 64, p);
      }
    }
  }

  TEST_CASE("rope_table then rope_apply is rope, bit for bit, on every kind of rotation") {
    // The forward pass computes each position's table once and applies it to q and k of every
    // layer; that must not change a single bit against rope's own call.
    std::mt19937 rng(99);
    std::vector<float> ff(32);
    for (int i = 0; i < 32; ++i) ff[i] = 1.0f + 7.0f * float(i) / 31.0f;
    for (auto pairing : {rope_pairing::adjacent, rope_pairing::neox})
      for (int kind = 0; kind < 5; ++kind) {
        CAPTURE(int(pairing));
        CAPTURE(kind);
        rope_params p;
        p.pairing = pairing;
        int head_dim = 64;
        if (kind == 1) {
          p.n_rot = 32;  // partial: the tail passes through
          head_dim = 80;
        } else if (kind == 2) {
          p.freq_factors = ff.data();
          p.freq_base = 500000.0f;
        } else if (kind == 3) {
          p.freq_scale = 0.25f;
          p.n_ctx_orig = 4096;
          p.ext_factor = 0.5f;
          p.attn_factor = 0.9f;
        } else if (kind == 4) {
          p.n_rot = 0;  // all of head_dim
          head_dim = 48;
        }
        std::vector<float> cs(static_cast<size_t>(rope_table_floats(head_dim, p)));
        CHECK(cs.size() == static_cast<size_t>(kind == 1 ? 32 : head_dim));
        for (const int64_t pos : {int64_t{0}, int64_t{1}, int64_t{777}, int64_t{131071}}) {
          CAPTURE(pos);
          const auto x = random_vector(rng, static_cast<size_t>(3 * head_dim));
          auto a = x, b = x;
          rope(a.data(), 3, head_dim, pos, p);
          rope_table(pos, head_dim, p, cs.data());
          rope_apply(b.data(), 3, head_dim, cs.data(), p);
          CHECK(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
        }
      }
  }

  TEST_CASE("every SIMD path rotates with the scalar path's bits, tails and partial rotations too") {
    // The forward pass's q and k must not depend on the CPU: llama.cpp's greedy tokens are
    // pinned on them. Pair counts below, at and above a vector, with leftover pairs.
    tandem::test::isa_guard guard;
    std::mt19937 rng(7);
    struct shape {
      int head_dim, n_rot;
    };
    for (const auto pairing : {rope_pairing::adjacent, rope_pairing::neox})
      for (const shape sh :
           {shape{64, 0}, shape{128, 0}, shape{80, 32}, shape{48, 0}, shape{20, 0}, shape{14, 12}, shape{6, 6}, shape{2, 2}, shape{96, 40}}) {
        CAPTURE(int(pairing));
        CAPTURE(sh.head_dim);
        CAPTURE(sh.n_rot);
        rope_params p;
        p.pairing = pairing;
        p.n_rot = sh.n_rot;
        std::vector<float> cs(static_cast<size_t>(rope_table_floats(sh.head_dim, p)));
        for (const int64_t pos : {int64_t{0}, int64_t{5}, int64_t{4097}}) {
          CAPTURE(pos);
          rope_table(pos, sh.head_dim, p, cs.data());
          const int n_heads = 5;
          // Large values too, where a fused multiply-add would round differently.
          const auto x = random_vector(rng, static_cast<size_t>(n_heads * sh.head_dim), 300.0f);
          std::vector<float> want;
          for (const isa path : tandem::test::supported_isas()) {
            CAPTURE(isa_name(path));
            set_isa(path);
            auto y = x;
            rope_apply(y.data(), n_heads, sh.head_dim, cs.data(), p);
            if (path == isa::scalar) want = y;
            CHECK(std::memcmp(y.data(), want.data(), y.size() * sizeof(float)) == 0);
          }
        }
      }
  }

  TEST_CASE("rotation preserves the norm of every pair") {
    std::mt19937 rng(11);
    for (auto pairing : {rope_pairing::adjacent, rope_pairing::neox}) {
      rope_params p;
      p.pairing = pairing;
      p.n_rot = 48;
      const int head_dim = 64, n_heads = 3, half = 24;
      for (bool yarn : {false, true}) {
        p.ext_factor = yarn ? 1.0f : 0.0f;
        p.freq_scale = yarn ? 0.5f : 1.0f;
        p.n_ctx_orig = 2048;
        // With YaRN every pair is scaled by the same mscale.
        const double mscale = yarn ? 1.0 + 0.1 * std::log(2.0) : 1.0;
        const auto x = random_vector(rng, size_t(n_heads) * head_dim);
        auto y = x;
        rope(y.data(), n_heads, head_dim, 999, p);
        for (int h = 0; h < n_heads; ++h)
          for (int i = 0; i < half; ++i) {
            const int a = h * head_dim + (pairing == rope_pairing::adjacent ? 2 * i : i);
            const int b = a + (pairing == rope_pairing::adjacent ? 1 : half);
            const double before = std::hypot(double(x[a]), double(x[b]));
            const double after = std::hypot(double(y[a]), double(y[b]));
            CHECK(after == doctest::Approx(before * mscale).epsilon(1e-5).scale(1e-6));
          }
      }
    }
  }

  TEST_CASE("position 0 is the identity and neox is adjacent on permuted dims") {
    std::mt19937 rng(3);
    const int head_dim = 32, n_heads = 2, half = 16;
    rope_params p;
    p.n_rot = head_dim;
    const auto x = random_vector(rng, size_t(n_heads) * head_dim);
    auto y = x;
    rope(y.data(), n_heads, head_dim, 0, p);
    CHECK(y == x);

    // Interleave the halves of each head: neox pair (i, i+half) becomes adjacent pair (2i, 2i+1).
    std::vector<float> perm(x.size());
    for (int h = 0; h < n_heads; ++h)
      for (int i = 0; i < half; ++i) {
        perm[h * head_dim + 2 * i] = x[h * head_dim + i];
        perm[h * head_dim + 2 * i + 1] = x[h * head_dim + i + half];
      }
    auto neox = x;
    p.pairing = rope_pairing::neox;
    rope(neox.data(), n_heads, head_dim, 123, p);
    p.pairing = rope_pairing::adjacent;
    rope(perm.data(), n_heads, head_dim, 123, p);
    for (int h = 0; h < n_heads; ++h)
      for (int i = 0; i < half; ++i) {
        CHECK(perm[h * head_dim + 2 * i] == neox[h * head_dim + i]);
        CHECK(perm[h * head_dim + 2 * i + 1] == neox[h * head_dim + i + half]);
      }
  }
}

namespace {

// |got - exact| in units of the float spacing at the exact value (subnormal spacing below).
double ulp_error(float got, double exact) {
  const float r = static_cast<float>(exact);
  const double spacing = std::max(static_cast<double>(std::nextafter(std::fabs(r), std::numeric_limits<float>::infinity()) - std::fabs(r)),
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
    std::vector<float> special = {0.0f, -0.0f, inf, -inf, std::numeric_limits<float>::quiet_NaN(), 88.72f, 88.73f, -87.33f, -103.9f, -200.0f, 200.0f};
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
    for (float v : {0.0f, -0.0f, inf, -inf, 65504.0f, 65519.996f, 65520.0f, 65536.0f, 1e9f, -65520.0f, std::ldexp(1.0f, -14), std::ldexp(1.0f, -24),
                    std::ldexp(1.0f, -25), std::ldexp(1.5f, -25), std::ldexp(1.0f, -26), std::ldexp(3.0f, -25), std::ldexp(1.0f, -20) * 1.3f})
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

  TEST_CASE("q8_0 and q4_0 rows are ggml's blocks, at the position's byte offset") {
    std::mt19937 rng(91);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    const int64_t row = 96;  // 3 blocks of 32
    std::vector<float> rows(size_t(2 * row));
    for (auto& x : rows) x = dist(rng);
    rows[5] = 40.0f;  // an outlier sets its block's scale
    for (const kv_type kt : {kv_type::q8_0, kv_type::q4_0}) {
      CAPTURE(kv_type_name(kt));
      const auto wt = kt == kv_type::q8_0 ? tandem::kernels::weight_type::q8_0 : tandem::kernels::weight_type::q4_0;
      CHECK(kv_bytes(kt, row) == (kt == kv_type::q8_0 ? 3 * 34 : 3 * 18));
      std::vector<unsigned char> cache(size_t(kv_bytes(kt, 5 * row)), 0xAB), want(size_t(kv_bytes(kt, 2 * row)));
      kv_store(cache.data(), kt, 2, rows.data(), 2, row);
      quantize_row(wt, rows.data(), want.data(), 2 * row);
      CHECK(std::memcmp(cache.data() + kv_bytes(kt, 2 * row), want.data(), want.size()) == 0);
      for (int64_t i = 0; i < kv_bytes(kt, 2 * row); ++i) CHECK(cache[size_t(i)] == 0xAB);
      for (int64_t i = kv_bytes(kt, 4 * row); i < kv_bytes(kt, 5 * row); ++i) CHECK(cache[size_t(i)] == 0xAB);
      // Within half a step of the input (q8_0), or a step (q4_0: 16 levels from -amax to 7/8
      // of amax on the other side, so the far end clips by up to one step).
      std::vector<float> back(size_t(2 * row));
      dequantize_row(wt, want.data(), back.data(), 2 * row);
      for (int64_t b = 0; b < 2 * row / 32; ++b) {
        float amax = 0;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(rows[size_t(b * 32 + j)]));
        const float bound = kt == kv_type::q8_0 ? amax / 127 * 0.51f : amax / 8;
        for (int j = 0; j < 32; ++j) CHECK(std::fabs(back[size_t(b * 32 + j)] - rows[size_t(b * 32 + j)]) <= bound + 1e-3f * amax);
      }
    }
    std::vector<float> odd(40);
    std::vector<unsigned char> sink(64);
    CHECK_THROWS_WITH_AS(kv_store(sink.data(), kv_type::q4_0, 0, odd.data(), 1, 40), doctest::Contains("multiple of 32"), std::invalid_argument);
  }
}

TEST_SUITE("hadamard_heads") {
  TEST_CASE("the normalised Walsh-Hadamard transform: orthogonal, its own inverse, dot products kept") {
    std::mt19937 rng(92);
    std::normal_distribution<float> dist(0.0f, 1.0f);
    // H_2 on one head: (a + b, a - b) / sqrt 2.
    std::vector<float> two{3.0f, 1.0f};
    hadamard_heads(two.data(), 1, 2, 1, 2);
    CHECK(two[0] == doctest::Approx(4.0 / std::sqrt(2.0)));
    CHECK(two[1] == doctest::Approx(2.0 / std::sqrt(2.0)));
    // A one-hot vector spreads evenly over the head: the outlier no longer dominates a block.
    std::vector<float> hot(64, 0.0f);
    hot[17] = 8.0f;
    hadamard_heads(hot.data(), 1, 64, 1, 64);
    for (const float x : hot) CHECK(std::fabs(x) == doctest::Approx(1.0));
    for (const int d : {32, 64, 128, 256}) {
      CAPTURE(d);
      const int heads = 3, n_rows = 2;
      const int64_t stride = int64_t(heads) * d + 5;  // rows with a gap the transform must not touch
      std::vector<float> a(size_t(n_rows * stride)), b(a.size());
      for (auto& x : a) x = dist(rng);
      for (auto& x : b) x = dist(rng);
      auto a2 = a, b2 = b;
      hadamard_heads(a2.data(), n_rows, stride, heads, d);
      hadamard_heads(b2.data(), n_rows, stride, heads, d);
      for (int r = 0; r < n_rows; ++r) {
        for (int h = 0; h < heads; ++h) {
          double dot = 0, dot2 = 0;
          for (int e = 0; e < d; ++e) {
            const size_t i = size_t(r * stride + h * d + e);
            dot += double(a[i]) * b[i];
            dot2 += double(a2[i]) * b2[i];
          }
          CHECK(dot2 == doctest::Approx(dot).epsilon(1e-5));
        }
        for (int64_t i = int64_t(heads) * d; i < stride; ++i) CHECK(a2[size_t(r * stride + i)] == a[size_t(r * stride + i)]);
      }
      hadamard_heads(a2.data(), n_rows, stride, heads, d);
      for (size_t i = 0; i < a.size(); ++i) CHECK(a2[i] == doctest::Approx(a[i]).epsilon(1e-5));
    }
    std::vector<float> x(48, 1.0f);
    CHECK_THROWS_WITH_AS(hadamard_heads(x.data(), 1, 48, 1, 48), doctest::Contains("power of two"), std::invalid_argument);
    CHECK(x[0] == 1.0f);
  }
}
