// Helpers of the attention tests (attention_test.cpp, attention_quant_test.cpp): caches filled
// through kv_store with their decoded values, a double-precision reference, and the shapes
// and problems the tests run.
#pragma once

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <utility>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/quants.h"
#include "kernels/cpu/thread_pool.h"

namespace tandem::test::attention_util {

using namespace tandem::kernels::cpu;

inline float round_f16(float v) { return fp16_to_fp32(fp32_to_fp16(v)); }

// A cache filled through kv_store, plus the values it holds decoded back to float.
struct test_cache {
  kv_type kt;
  int64_t row;                 // n_kv_heads * head_dim
  std::vector<float> storage;  // the cache's bytes (floats: aligned for every type)
  std::vector<float> decoded;

  test_cache(kv_type t, int64_t n_ctx, int64_t row_elems) : kt(t), row(row_elems) {
    storage.assign(size_t(kv_bytes(t, n_ctx * row) + 3) / 4, 0.0f);
    decoded.assign(size_t(n_ctx * row), 0.0f);
  }
  void* data() { return storage.data(); }
  void store(int64_t pos, const std::vector<float>& rows, int64_t n) {
    kv_store(data(), kt, pos, rows.data(), n, row);
    for (int64_t p = pos; p < pos + n; ++p) {
      const auto* src = reinterpret_cast<const unsigned char*>(storage.data()) + kv_bytes(kt, p * row);
      float* dst = decoded.data() + p * row;
      if (kt == kv_type::f32) {
        std::memcpy(dst, src, size_t(row) * 4);
      } else if (kt == kv_type::f16) {
        for (int64_t i = 0; i < row; ++i) {
          uint16_t h;
          std::memcpy(&h, src + 2 * i, 2);
          dst[i] = fp16_to_fp32(h);
        }
      } else {
        dequantize_row(kt == kv_type::q8_0 ? tandem::kernels::weight_type::q8_0 : tandem::kernels::weight_type::q4_0, src, dst, row);
      }
    }
  }
};

// Double-precision causal GQA attention over the decoded cache. With f16_contract it follows
// the contract for an f16 cache instead (llama.cpp's CPU flash-attention arithmetic): Q
// rounded to f16, online softmax, and the weighted sum of values kept in an f16 accumulator
// that is rounded after every rescale and every added row, divided by the sum at the end.
inline std::vector<double> reference_attention(const std::vector<float>& q, int64_t n_q, int64_t pos0, const test_cache& k, const test_cache& v,
                                               int n_heads, int n_kv_heads, int head_dim, double scale, bool f16_contract) {
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

inline std::vector<float> random_vector(std::mt19937& rng, size_t n, float sd) {
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> v(n);
  for (auto& x : v) x = dist(rng);
  return v;
}

struct shape {
  int n_heads, n_kv_heads, head_dim;
  int64_t n_q, pos0;
};

// Shapes covering every branch of the paths: GQA ratios 1, 2, 4 and 8; head_dim multiples of
// 16 and not (40, 80: 8-float tails in 16-lane code; 20, 100: tails of a dot's 8 lanes and of
// the padding); one key, decode, prefill, chunked prefill, and contexts past the 16-key blocks
// up to 1000 keys.
inline const shape k_shapes[] = {
    {4, 4, 16, 1, 0},     // first token, MHA
    {4, 4, 16, 1, 37},    // decode, MHA
    {8, 4, 32, 1, 100},   // decode, GQA 2
    {8, 2, 64, 5, 0},     // prefill from scratch, GQA 4
    {8, 2, 64, 6, 21},    // chunked prefill after earlier tokens, GQA 4
    {6, 3, 24, 3, 9},     // GQA 2, head_dim not a multiple of 16
    {16, 4, 64, 1, 127},  // decode as the 250M synth model (16 heads on 4 KV heads)
    {8, 1, 40, 3, 200},   // GQA 8, head_dim 40
    {4, 4, 80, 2, 300},   // MHA, head_dim 80
    {4, 2, 20, 4, 33},    // head_dim 20: dot tail of 4
    {8, 1, 128, 2, 998},  // GQA 8, head_dim 128, 1000 keys
    {2, 1, 100, 1, 999},  // head_dim 100, 1000 keys
};

struct problem {
  test_cache k, v;
  std::vector<float> q;
  float scale;
};

inline problem make_problem(std::mt19937& rng, const shape& sh, kv_type kt) {
  const int64_t n_ctx = sh.pos0 + sh.n_q + 3;
  const int64_t row = int64_t(sh.n_kv_heads) * sh.head_dim;
  problem p{test_cache(kt, n_ctx, row), test_cache(kt, n_ctx, row), {}, 1.0f / std::sqrt(float(sh.head_dim))};
  const int64_t n_keys = sh.pos0 + sh.n_q;
  p.k.store(0, random_vector(rng, size_t(n_keys * row), 1.0f), n_keys);
  p.v.store(0, random_vector(rng, size_t(n_keys * row), 1.0f), n_keys);
  // Keys beyond the last query position must be ignored (causal): poison them.
  std::vector<float> poison(size_t(3 * row), 1e4f);
  p.k.store(n_keys, poison, 3);
  p.v.store(n_keys, poison, 3);
  p.q = random_vector(rng, size_t(sh.n_q * sh.n_heads * sh.head_dim), 1.0f);
  return p;
}

inline std::vector<float> run(problem& p, const shape& sh, kv_type kt, thread_pool* pool) {
  std::vector<float> out(p.q.size(), -1.0f);
  attention(p.q.data(), sh.n_q, sh.pos0, p.k.data(), p.v.data(), kt, sh.n_heads, sh.n_kv_heads, sh.head_dim, p.scale, out.data(), pool);
  return out;
}

// One problem per (query rows, first position), all of 8 query heads over 2 KV heads of 64.
struct run_set {
  std::vector<problem> ps;
  std::vector<shape> shapes;
};
inline run_set make_runs(std::mt19937& rng, const std::vector<std::pair<int64_t, int64_t>>& lens, kv_type kt, int n_heads = 8, int n_kv_heads = 2) {
  run_set s;
  for (const auto& [n_q, pos0] : lens) {
    s.shapes.push_back({n_heads, n_kv_heads, 64, n_q, pos0});
    s.ps.push_back(make_problem(rng, s.shapes.back(), kt));
  }
  return s;
}

}  // namespace tandem::test::attention_util
