#include "kernels/cpu/ops.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>
#include <random>
#include <vector>

#include "kernels/cpu/isa.h"
#include "tests/kernels/kernel_test_util.h"
#include "tests/test_support.h"

using namespace tandem::kernels::cpu;

namespace {

// Straightforward double-precision RoPE from the published formulas (RoFormer; YaRN paper
// and ggml's rope_yarn for the ramp between the correction dims and the magnitude scale).
std::vector<double> reference_rope(const std::vector<float>& x, int n_heads, int head_dim, int64_t pos,
                                   const rope_params& p) {
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

std::vector<float> random_vector(std::mt19937& rng, size_t n, float sd = 1.0f) {
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
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
      for (const shape sh : {shape{64, 0}, shape{128, 0}, shape{80, 32}, shape{48, 0}, shape{20, 0}, shape{14, 12}, shape{6, 6},
                             shape{2, 2}, shape{96, 40}}) {
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
