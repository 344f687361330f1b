#include "kernels/cpu/ops.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu/quants.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/test_support.h"

using namespace tandem::kernels::cpu;

namespace {

float round_f16(float v) { return fp16_to_fp32(fp32_to_fp16(v)); }

// A cache filled through kv_store, plus the values it holds decoded back to float.
struct test_cache {
  kv_type kt;
  int64_t row;  // n_kv_heads * head_dim
  std::vector<float> f32;
  std::vector<uint16_t> f16;
  std::vector<float> decoded;

  test_cache(kv_type t, int64_t n_ctx, int64_t row_elems) : kt(t), row(row_elems) {
    if (t == kv_type::f32) f32.assign(size_t(n_ctx * row), 0.0f);
    else f16.assign(size_t(n_ctx * row), 0);
    decoded.assign(size_t(n_ctx * row), 0.0f);
  }
  void* data() { return kt == kv_type::f32 ? static_cast<void*>(f32.data()) : static_cast<void*>(f16.data()); }
  void store(int64_t pos, const std::vector<float>& rows, int64_t n) {
    kv_store(data(), kt, pos, rows.data(), n, row);
    for (int64_t i = 0; i < n * row; ++i)
      decoded[size_t(pos * row + i)] = kt == kv_type::f32 ? f32[size_t(pos * row + i)] : fp16_to_fp32(f16[size_t(pos * row + i)]);
  }
};

// Double-precision causal GQA attention over the decoded cache. With f16_contract it follows
// the contract for an f16 cache instead (llama.cpp's CPU flash-attention arithmetic): Q
// rounded to f16, online softmax, and the weighted sum of values kept in an f16 accumulator
// that is rounded after every rescale and every added row, divided by the sum at the end.
std::vector<double> reference_attention(const std::vector<float>& q, int64_t n_q, int64_t pos0, const test_cache& k,
                                        const test_cache& v, int n_heads, int n_kv_heads, int head_dim, double scale,
                                        bool f16_contract) {
  std::vector<double> out(q.size(), 0.0);
  const int group = n_heads / n_kv_heads;
  for (int64_t r = 0; r < n_q; ++r)
    for (int h = 0; h < n_heads; ++h) {
      const int64_t n_keys = pos0 + r + 1;
      const int kvh = h / group;
      double* o = &out[size_t((r * n_heads + h) * head_dim)];
      std::vector<double> s(static_cast<size_t>(n_keys));
      for (int64_t t = 0; t < n_keys; ++t) {
        double dot = 0;
        for (int d = 0; d < head_dim; ++d) {
          float qv = q[size_t((r * n_heads + h) * head_dim + d)];
          if (f16_contract) qv = round_f16(qv);
          dot += double(qv) * k.decoded[size_t(t * k.row + kvh * head_dim + d)];
        }
        s[size_t(t)] = dot * scale;
      }
      const auto vrow = [&](int64_t t, int d) { return v.decoded[size_t(t * v.row + kvh * head_dim + d)]; };
      if (f16_contract) {
        double m = -1e300, sum = 0;
        for (int64_t t = 0; t < n_keys; ++t) {
          double scale_old = 1, w = 1;
          if (s[size_t(t)] > m) {
            scale_old = std::exp(m - s[size_t(t)]);
            m = s[size_t(t)];
            for (int d = 0; d < head_dim; ++d) o[d] = round_f16(float(o[d] * scale_old));
          } else {
            w = std::exp(s[size_t(t)] - m);
          }
          for (int d = 0; d < head_dim; ++d) o[d] = round_f16(float(o[d] + vrow(t, d) * w));
          sum = sum * scale_old + w;
        }
        for (int d = 0; d < head_dim; ++d) o[d] /= sum;
        continue;
      }
      double mx = -1e300;
      for (const double x : s) mx = std::max(mx, x);
      double sum = 0;
      for (auto& x : s) sum += x = std::exp(x - mx);
      for (int64_t t = 0; t < n_keys; ++t)
        for (int d = 0; d < head_dim; ++d) o[d] += s[size_t(t)] / sum * vrow(t, d);
    }
  return out;
}

std::vector<float> random_vector(std::mt19937& rng, size_t n, float sd) {
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

}  // namespace

TEST_SUITE("attention") {
  TEST_CASE("matches a double-precision reference") {
    std::mt19937 rng(777);
    thread_pool pool2(2);
    struct shape {
      int n_heads, n_kv_heads, head_dim;
      int64_t n_q, pos0;
    };
    const shape shapes[] = {
        {4, 4, 16, 1, 0},    // first token, MHA
        {4, 4, 16, 1, 37},   // decode, MHA
        {8, 4, 32, 1, 100},  // decode, GQA 2
        {8, 2, 64, 5, 0},    // prefill from scratch, GQA 4
        {8, 2, 64, 6, 21},   // chunked prefill after earlier tokens, GQA 4
        {6, 3, 24, 3, 9},    // GQA 2, head_dim not a multiple of 8
    };
    for (const auto& sh : shapes)
      for (kv_type kt : {kv_type::f32, kv_type::f16})
        for (thread_pool* pool : {static_cast<thread_pool*>(nullptr), &pool2}) {
          CAPTURE(sh.n_heads);
          CAPTURE(sh.n_kv_heads);
          CAPTURE(sh.head_dim);
          CAPTURE(sh.n_q);
          CAPTURE(sh.pos0);
          CAPTURE(int(kt));
          CAPTURE(pool != nullptr);
          const int64_t n_ctx = sh.pos0 + sh.n_q + 3;
          const int64_t row = int64_t(sh.n_kv_heads) * sh.head_dim;
          test_cache k(kt, n_ctx, row), v(kt, n_ctx, row);
          const int64_t n_keys = sh.pos0 + sh.n_q;
          k.store(0, random_vector(rng, size_t(n_keys * row), 1.0f), n_keys);
          v.store(0, random_vector(rng, size_t(n_keys * row), 1.0f), n_keys);
          // Keys beyond the last query position must be ignored (causal): poison them.
          std::vector<float> poison(size_t(3 * row), 1e4f);
          k.store(n_keys, poison, 3);
          v.store(n_keys, poison, 3);

          const auto q = random_vector(rng, size_t(sh.n_q * sh.n_heads * sh.head_dim), 1.0f);
          std::vector<float> out(q.size(), -1.0f);
          const float scale = 1.0f / std::sqrt(float(sh.head_dim));
          attention(q.data(), sh.n_q, sh.pos0, k.data(), v.data(), kt, sh.n_heads, sh.n_kv_heads, sh.head_dim, scale,
                    out.data(), pool);
          const bool f16 = kt == kv_type::f16;
          const auto ref = reference_attention(q, sh.n_q, sh.pos0, k, v, sh.n_heads, sh.n_kv_heads, sh.head_dim, scale, f16);
          // f16: an accumulator value whose float and double results straddle an f16 rounding
          // boundary moves by one f16 ulp (~1e-3 of values of order 1), hence the looser bound.
          const double tol = f16 ? 2e-3 : 2e-6;
          double worst = 0;
          for (size_t i = 0; i < out.size(); ++i) worst = std::max(worst, std::fabs(out[i] - ref[i]));
          CHECK(worst <= tol);
          if (f16) {
            // The f16 arithmetic still lands close to exact attention over the same cache.
            const auto exact = reference_attention(q, sh.n_q, sh.pos0, k, v, sh.n_heads, sh.n_kv_heads, sh.head_dim, scale, false);
            double drift = 0;
            for (size_t i = 0; i < out.size(); ++i) drift = std::max(drift, std::fabs(out[i] - exact[i]));
            CHECK(drift <= 1e-2);
          }
        }
  }

  TEST_CASE("a single key returns its value row") {
    const int n_heads = 4, n_kv_heads = 2, head_dim = 8;
    std::mt19937 rng(8);
    for (kv_type kt : {kv_type::f32, kv_type::f16}) {
      CAPTURE(int(kt));
      test_cache k(kt, 1, n_kv_heads * head_dim), v(kt, 1, n_kv_heads * head_dim);
      k.store(0, random_vector(rng, n_kv_heads * head_dim, 1.0f), 1);
      v.store(0, random_vector(rng, n_kv_heads * head_dim, 1.0f), 1);
      const auto q = random_vector(rng, n_heads * head_dim, 3.0f);
      std::vector<float> out(q.size());
      attention(q.data(), 1, 0, k.data(), v.data(), kt, n_heads, n_kv_heads, head_dim, 0.3f, out.data(), nullptr);
      for (int h = 0; h < n_heads; ++h)
        for (int d = 0; d < head_dim; ++d) CHECK(out[h * head_dim + d] == v.decoded[(h / 2) * head_dim + d]);
    }
  }

  TEST_CASE("f16 cache rounds Q to f16 and accumulates values in f16") {
    // head_dim 8, two keys: k0 = 0, k1 = 8 * e0, v0 = e0, v1 = 0. Key 0 (score 0) is added
    // first with weight 1; key 1 (score 8 q0) raises the running max, so the accumulator is
    // rescaled by exp(-8 q0) and rounded to f16, then divided by the sum 1 + exp(-8 q0).
    // q0 = 1 + 1.9 * 2^-12 rounds to 1.0 in f16, so the expected value uses exp(-8) exactly.
    const int head_dim = 8;
    std::vector<float> k_rows(16, 0.0f), v_rows(16, 0.0f), q(8, 0.0f);
    k_rows[8] = 8.0f;
    v_rows[0] = 1.0f;
    q[0] = 1.0f + 1.9f / 4096.0f;
    std::vector<uint16_t> kc(16), vc(16);
    kv_store(kc.data(), kv_type::f16, 0, k_rows.data(), 2, head_dim);
    kv_store(vc.data(), kv_type::f16, 0, v_rows.data(), 2, head_dim);
    std::vector<float> out(8);
    attention(q.data(), 1, 1, kc.data(), vc.data(), kv_type::f16, 1, 1, head_dim, 1.0f, out.data(), nullptr);

    const auto expected = [](float gap) {
      const float rescale = std::exp(-gap);
      return round_f16(rescale) * (1.0f / (rescale + 1.0f));
    };
    REQUIRE(expected(8.0f) != expected(8.0f * q[0]));
    CHECK(out[0] == expected(8.0f));
    for (int d = 1; d < head_dim; ++d) CHECK(out[d] == 0.0f);

    // The same data in an f32 cache is not rounded at all.
    std::vector<float> out32(8);
    attention(q.data(), 1, 1, k_rows.data(), v_rows.data(), kv_type::f32, 1, 1, head_dim, 1.0f, out32.data(), nullptr);
    CHECK(out32[0] == doctest::Approx(1.0 / (1.0 + std::exp(8.0 * double(q[0])))).epsilon(1e-6));
  }
}
