#include "models/forward.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include <unistd.h>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quants.h"

namespace tandem::models {
namespace {

using kernels::cpu::matmul;

void project(const weight_view& w, const float* x, int64_t n, float* y, kernels::cpu::thread_pool* pool) {
  matmul(w.type, w.data, w.rows, w.cols, x, n, y, pool);
}

void add_bias(float* y, const float* b, int64_t n_rows, int64_t dim) {
  if (!b) return;
  for (int64_t r = 0; r < n_rows; ++r)
    for (int64_t i = 0; i < dim; ++i) y[r * dim + i] += b[i];
}

kernels::cpu::rope_params make_rope(const model_config& c, const model_weights& w) {
  kernels::cpu::rope_params r;
  r.n_rot = c.n_rot;
  r.freq_base = c.rope_base;
  r.pairing = c.rope_pairing;
  r.freq_factors = w.rope_freqs;
  r.n_ctx_orig = static_cast<int>(c.rope_orig_ctx);
  if (c.rope_scaling != rope_scaling_type::none) r.freq_scale = 1.0f / c.rope_scale_factor;
  if (c.rope_scaling == rope_scaling_type::yarn) {
    r.ext_factor = 1.0f;
    r.attn_factor = c.yarn_attn_factor;
    r.beta_fast = c.yarn_beta_fast;
    r.beta_slow = c.yarn_beta_slow;
  }
  return r;
}

size_t kv_elem_bytes(kernels::cpu::kv_type t) { return t == kernels::cpu::kv_type::f16 ? 2 : 4; }

uint64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

}  // namespace

uint64_t kv_cache_bytes(const model_config& c, int64_t n_ctx, kernels::cpu::kv_type kv) {
  // K and V, every layer; n_ctx <= 2^24, kv_dim <= 2^22 and n_layer <= 1024 keep this in range.
  return 2ull * static_cast<uint64_t>(c.n_layer) * static_cast<uint64_t>(n_ctx) * static_cast<uint64_t>(c.kv_dim()) *
         kv_elem_bytes(kv);
}

forward_context::forward_context(const model& m, const context_params& p, kernels::cpu::thread_pool* pool)
    : model_(m),
      pool_(pool),
      kv_type_(p.kv),
      rope_(make_rope(m.config(), m.weights())),
      n_ctx_(p.n_ctx > 0 ? p.n_ctx : m.config().n_ctx_train),
      max_batch_(std::max<int64_t>(1, p.max_batch)),
      n_vocab_(m.config().n_vocab) {
  const auto& c = m.config();
  if (n_ctx_ < 1 || n_ctx_ > k_max_context)
    throw std::invalid_argument("context size " + std::to_string(n_ctx_) + " is outside [1, " + std::to_string(k_max_context) + "]");
  // The context size may come from file metadata (the training context), so a file could ask
  // for far more cache than the machine has: refuse that with a message instead of bad_alloc.
  const uint64_t cache_bytes = kv_cache_bytes(c, n_ctx_, kv_type_);
  if (const uint64_t ram = physical_memory_bytes(); ram > 0 && cache_bytes > ram)
    throw std::runtime_error("a KV cache for " + std::to_string(n_ctx_) + " tokens needs " +
                             std::to_string(cache_bytes >> 20) + " MiB, more than this machine's " + std::to_string(ram >> 20) +
                             " MiB of memory; use a smaller context size");
  const size_t layer_bytes = static_cast<size_t>(n_ctx_ * c.kv_dim()) * kv_elem_bytes(kv_type_);
  k_cache_.assign(c.n_layer, std::vector<std::byte>(layer_bytes));
  v_cache_.assign(c.n_layer, std::vector<std::byte>(layer_bytes));
  const auto rows = static_cast<size_t>(max_batch_);
  x_.resize(rows * c.n_embd);
  xb_.resize(rows * std::max(c.n_embd, c.q_dim()));
  q_.resize(rows * c.q_dim());
  k_.resize(rows * c.kv_dim());
  v_.resize(rows * c.kv_dim());
  attn_.resize(rows * c.q_dim());
  ff_gate_.resize(rows * c.n_ff);
  ff_up_.resize(rows * c.n_ff);
  logits_.resize(static_cast<size_t>(n_vocab_));
}

void forward_context::truncate(int64_t pos) {
  if (pos < 0 || pos > pos_) throw std::invalid_argument("truncate: position " + std::to_string(pos) + " is outside [0, " + std::to_string(pos_) + "]");
  pos_ = pos;
}

void forward_context::eval(std::span<const int32_t> tokens, bool all_logits) {
  if (tokens.empty()) return;
  for (const int32_t t : tokens)
    if (t < 0 || t >= n_vocab_) throw std::invalid_argument("token id " + std::to_string(t) + " is outside the vocabulary (" + std::to_string(n_vocab_) + ")");
  if (pos_ + static_cast<int64_t>(tokens.size()) > n_ctx_)
    throw std::invalid_argument("context overflow: " + std::to_string(pos_) + " + " + std::to_string(tokens.size()) + " tokens exceed the context size " + std::to_string(n_ctx_));
  const auto n = static_cast<int64_t>(tokens.size());
  if (all_logits) logits_.resize(static_cast<size_t>(n * n_vocab_));
  n_logit_rows_ = all_logits ? n : 1;
  for (int64_t done = 0; done < n; done += max_batch_) {
    const int64_t chunk = std::min(max_batch_, n - done);
    eval_chunk(tokens.data() + done, chunk, all_logits ? logits_.data() + done * n_vocab_ : nullptr);
  }
}

void forward_context::eval_chunk(const int32_t* tokens, int64_t n, float* all_logits) {
  const auto& c = model_.config();
  const auto& w = model_.weights();
  const int64_t D = c.n_embd, Q = c.q_dim(), KV = c.kv_dim(), F = c.n_ff, hd = c.head_dim;
  const int64_t pos0 = pos_;

  for (int64_t r = 0; r < n; ++r) {
    const auto* row = static_cast<const std::byte*>(w.token_embd.data) + tokens[r] * kernels::row_bytes(w.token_embd.type, D);
    kernels::cpu::dequantize_row(w.token_embd.type, row, x_.data() + r * D, D);
  }

  const float attn_scale = 1.0f / std::sqrt(static_cast<float>(hd));
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const auto& L = w.layers[l];
    // Attention block.
    for (int64_t r = 0; r < n; ++r) kernels::cpu::rms_norm(x_.data() + r * D, L.attn_norm, xb_.data() + r * D, D, c.rms_eps);
    project(L.wq, xb_.data(), n, q_.data(), pool_);
    project(L.wk, xb_.data(), n, k_.data(), pool_);
    project(L.wv, xb_.data(), n, v_.data(), pool_);
    add_bias(q_.data(), L.bq, n, Q);
    add_bias(k_.data(), L.bk, n, KV);
    add_bias(v_.data(), L.bv, n, KV);
    for (int64_t r = 0; r < n; ++r) {
      float* q = q_.data() + r * Q;
      float* k = k_.data() + r * KV;
      if (L.q_norm) {
        for (int64_t h = 0; h < c.n_head; ++h) kernels::cpu::rms_norm(q + h * hd, L.q_norm, q + h * hd, hd, c.rms_eps);
        for (int64_t h = 0; h < c.n_head_kv; ++h) kernels::cpu::rms_norm(k + h * hd, L.k_norm, k + h * hd, hd, c.rms_eps);
      }
      kernels::cpu::rope(q, static_cast<int>(c.n_head), static_cast<int>(hd), pos0 + r, rope_);
      kernels::cpu::rope(k, static_cast<int>(c.n_head_kv), static_cast<int>(hd), pos0 + r, rope_);
    }
    kernels::cpu::kv_store(k_cache_[l].data(), kv_type_, pos0, k_.data(), n, KV);
    kernels::cpu::kv_store(v_cache_[l].data(), kv_type_, pos0, v_.data(), n, KV);
    kernels::cpu::attention(q_.data(), n, pos0, k_cache_[l].data(), v_cache_[l].data(), kv_type_, static_cast<int>(c.n_head),
                            static_cast<int>(c.n_head_kv), static_cast<int>(hd), attn_scale, attn_.data(), pool_);
    project(L.wo, attn_.data(), n, xb_.data(), pool_);
    for (int64_t i = 0; i < n * D; ++i) x_[i] += xb_[i];

    // Feed-forward block (SwiGLU).
    for (int64_t r = 0; r < n; ++r) kernels::cpu::rms_norm(x_.data() + r * D, L.ffn_norm, xb_.data() + r * D, D, c.rms_eps);
    project(L.w_gate, xb_.data(), n, ff_gate_.data(), pool_);
    project(L.w_up, xb_.data(), n, ff_up_.data(), pool_);
    kernels::cpu::swiglu(ff_gate_.data(), ff_up_.data(), n * F);
    project(L.w_down, ff_gate_.data(), n, xb_.data(), pool_);
    for (int64_t i = 0; i < n * D; ++i) x_[i] += xb_[i];
  }

  // Output head: only the rows whose logits are wanted.
  const int64_t first = all_logits ? 0 : n - 1;
  const int64_t rows = n - first;
  for (int64_t r = first; r < n; ++r) kernels::cpu::rms_norm(x_.data() + r * D, w.output_norm, xb_.data() + (r - first) * D, D, c.rms_eps);
  project(w.output, xb_.data(), rows, all_logits ? all_logits : logits_.data(), pool_);
  pos_ += n;
}

}  // namespace tandem::models
