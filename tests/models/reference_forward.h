// A plain double-precision Llama-family forward pass over the same weights, for tests: no
// activation quantization, no F16 KV cache, no batching, no threads. Weights are dequantized
// with the scalar reference (models::dequantize_weight_row). Only what tests need: full
// recomputation over the whole token sequence, returning the last position's logits.
#pragma once

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "kernels/cpu/quants.h"
#include "models/model.h"

namespace tandem::test {

inline std::vector<double> ref_matrix_row(const models::weight_view& w, int64_t row) {
  std::vector<float> f(static_cast<size_t>(w.cols));
  models::dequantize_weight_row(w, row, f.data());  // GGUF rows or packed panels
  return {f.begin(), f.end()};
}

// y = W x
inline std::vector<double> ref_matvec(const models::weight_view& w, const std::vector<double>& x) {
  std::vector<double> y(static_cast<size_t>(w.rows));
  for (int64_t o = 0; o < w.rows; ++o) {
    const auto row = ref_matrix_row(w, o);
    double s = 0;
    for (int64_t i = 0; i < w.cols; ++i) s += row[i] * x[i];
    y[o] = s;
  }
  return y;
}

inline void ref_rms_norm(std::vector<double>& x, size_t off, size_t n, const float* w, double eps) {
  double ss = 0;
  for (size_t i = 0; i < n; ++i) ss += x[off + i] * x[off + i];
  const double s = 1.0 / std::sqrt(ss / n + eps);
  for (size_t i = 0; i < n; ++i) x[off + i] = x[off + i] * s * (w ? w[i] : 1.0);
}

// RoPE without scaling (synthetic and test models use none).
inline void ref_rope(std::vector<double>& x, size_t off, int head_dim, int n_rot, int64_t pos, double base, bool neox) {
  for (int i = 0; i < n_rot / 2; ++i) {
    const double theta = pos * std::pow(base, -2.0 * i / n_rot);
    const double c = std::cos(theta), s = std::sin(theta);
    const size_t a = neox ? off + i : off + 2 * i;
    const size_t b = neox ? off + i + n_rot / 2 : off + 2 * i + 1;
    const double x0 = x[a], x1 = x[b];
    x[a] = x0 * c - x1 * s;
    x[b] = x0 * s + x1 * c;
  }
  (void)head_dim;
}

// max |got - want| / max |want|: the error measure the forward tests state tolerances in.
inline double relative_max_error(std::span<const float> got, const std::vector<double>& want) {
  double diff = 0, scale = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    diff = std::max(diff, std::abs(got[i] - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return scale > 0 ? diff / scale : diff;
}

inline std::vector<double> reference_logits(const models::model& m, std::span<const int32_t> tokens) {
  const auto& c = m.config();
  const auto& w = m.weights();
  const size_t D = c.n_embd, Q = c.q_dim(), KV = c.kv_dim(), hd = c.head_dim, T = tokens.size();
  const bool neox = c.rope_pairing == kernels::cpu::rope_pairing::neox;
  std::vector<std::vector<double>> x(T);
  for (size_t t = 0; t < T; ++t) x[t] = ref_matrix_row(w.token_embd, tokens[t]);
  for (const auto& L : w.layers) {
    std::vector<std::vector<double>> q(T), k(T), v(T);
    for (size_t t = 0; t < T; ++t) {
      auto h = x[t];
      ref_rms_norm(h, 0, D, L.attn_norm, c.rms_eps);
      q[t] = ref_matvec(L.wq, h);
      k[t] = ref_matvec(L.wk, h);
      v[t] = ref_matvec(L.wv, h);
      for (size_t i = 0; L.bq && i < Q; ++i) q[t][i] += L.bq[i];
      for (size_t i = 0; L.bk && i < KV; ++i) k[t][i] += L.bk[i];
      for (size_t i = 0; L.bv && i < KV; ++i) v[t][i] += L.bv[i];
      for (size_t hh = 0; hh < static_cast<size_t>(c.n_head); ++hh) {
        if (L.q_norm) ref_rms_norm(q[t], hh * hd, hd, L.q_norm, c.rms_eps);
        ref_rope(q[t], hh * hd, static_cast<int>(hd), c.n_rot, static_cast<int64_t>(t), c.rope_base, neox);
      }
      for (size_t hh = 0; hh < static_cast<size_t>(c.n_head_kv); ++hh) {
        if (L.k_norm) ref_rms_norm(k[t], hh * hd, hd, L.k_norm, c.rms_eps);
        ref_rope(k[t], hh * hd, static_cast<int>(hd), c.n_rot, static_cast<int64_t>(t), c.rope_base, neox);
      }
    }
    const size_t group = c.n_head / c.n_head_kv;
    for (size_t t = 0; t < T; ++t) {
      std::vector<double> att(Q, 0.0);
      for (size_t hh = 0; hh < static_cast<size_t>(c.n_head); ++hh) {
        const size_t kvh = hh / group;
        std::vector<double> s(t + 1);
        double mx = -1e300;
        for (size_t j = 0; j <= t; ++j) {
          double d = 0;
          for (size_t i = 0; i < hd; ++i) d += q[t][hh * hd + i] * k[j][kvh * hd + i];
          s[j] = d / std::sqrt(static_cast<double>(hd));
          mx = std::max(mx, s[j]);
        }
        double sum = 0;
        for (auto& e : s) sum += (e = std::exp(e - mx));
        for (size_t j = 0; j <= t; ++j)
          for (size_t i = 0; i < hd; ++i) att[hh * hd + i] += s[j] / sum * v[j][kvh * hd + i];
      }
      const auto o = ref_matvec(L.wo, att);
      for (size_t i = 0; i < D; ++i) x[t][i] += o[i];
      auto h = x[t];
      ref_rms_norm(h, 0, D, L.ffn_norm, c.rms_eps);
      auto g = ref_matvec(L.w_gate, h);
      const auto u = ref_matvec(L.w_up, h);
      for (size_t i = 0; i < g.size(); ++i) g[i] = g[i] / (1.0 + std::exp(-g[i])) * u[i];
      const auto d = ref_matvec(L.w_down, g);
      for (size_t i = 0; i < D; ++i) x[t][i] += d[i];
    }
  }
  auto h = x[T - 1];
  ref_rms_norm(h, 0, D, w.output_norm, c.rms_eps);
  return ref_matvec(w.output, h);
}

}  // namespace tandem::test
