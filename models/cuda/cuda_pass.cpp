#include "models/cuda/cuda_pass.h"

#include <cmath>

namespace tandem::models {

using kernels::cpu::kv_type;

cuda_pass::cuda_pass(const model_config& c, gpu_device_state& d, const cu::stream& s, const kernels::cpu::rope_params& rope, kv_type kv,
                     bool kv_rotate, std::byte* kv_base, int64_t block_tokens, const int32_t* tokens, int64_t n, const int64_t* out_rows,
                     int64_t n_out, int64_t max_rows)
    : c_(c),
      d_(d),
      st_(s),
      s_(s.get()),
      rope_(rope),
      kv_(kv),
      kv_rotate_(kv_rotate),
      kv_base_(kv_base),
      block_tokens_(block_tokens),
      tokens_(tokens),
      n_(n),
      out_rows_(out_rows),
      n_out_(n_out),
      max_rows_(max_rows),
      rows_{d.pos.as<int32_t>(), d.tables.as<int32_t>(), d.table_of_row.as<int32_t>()} {}

float* cuda_pass::buf(act a) const {
  switch (a) {
    case act::x:
      return d_.x;
    case act::xb:
      return d_.xb;
    case act::q:
      return d_.q;
    case act::k:
      return d_.k;
    case act::v:
      return d_.v;
    case act::attn:
      return d_.attn;
    case act::gate:
      return d_.gate;
    case act::up:
      return d_.up;
  }
  return nullptr;
}

int64_t cuda_pass::width(act a) const {
  switch (a) {
    case act::x:
    case act::xb:
      return c_.n_embd;
    case act::q:
    case act::attn:
      return c_.q_dim();
    case act::k:
    case act::v:
      return c_.kv_dim();
    case act::gate:
    case act::up:
      return c_.n_ff;
  }
  return 0;
}

void cuda_pass::mat(const weight_view& w, const float* x, int64_t n_x, float* y) {
  d_.gemm.run(w.type, w.data, w.rows, w.cols, x, n_x, y, d_.gemm_scratch.get(), d_.gemm_scratch.size());
}

cu::paged_layer cuda_pass::layer_of(int64_t layer) const {
  return {kv_base_ + (2 * static_cast<size_t>(layer)) * d_.part_bytes,
          kv_base_ + (2 * static_cast<size_t>(layer) + 1) * d_.part_bytes,
          kv_,
          block_tokens_,
          static_cast<int64_t>(d_.block_stride),
          c_.kv_dim()};
}

void cuda_pass::embed(const weight_view& table, int64_t row0) {
  // Each run of rows whose tokens fall in the piece is one gather with ids relative to it.
  // A piece's ids have staging of their own: an earlier piece's copy may still be queued.
  const int64_t end = row0 + table.rows;
  auto in_piece = [&](int64_t r) { return tokens_[r] >= row0 && tokens_[r] < end; };
  int32_t* rel = d_.h_rel + static_cast<int64_t>(embed_pieces_++) * max_rows_;
  for (int64_t r = 0; r < n_; ++r) rel[r] = static_cast<int32_t>(tokens_[r] - row0);
  cu::copy_to_device(d_.rel_ids.get(), rel, static_cast<size_t>(n_) * sizeof(int32_t), s_);
  for (int64_t r0 = 0; r0 < n_;) {
    if (!in_piece(r0)) {
      ++r0;
      continue;
    }
    int64_t r1 = r0 + 1;
    while (r1 < n_ && in_piece(r1)) ++r1;
    cu::get_rows(table.type, table.data, c_.n_embd, d_.rel_ids.as<int32_t>() + r0, r1 - r0, d_.x + r0 * c_.n_embd, s_);
    r0 = r1;
  }
}

void cuda_pass::output_norm(const float* w) {
  const int64_t D = c_.n_embd;
  for (int64_t k = 0; k < n_out_; ++k) cu::rms_norm(d_.x + out_rows_[k] * D, w, d_.xb + k * D, 1, D, c_.rms_eps, s_);
}

void cuda_pass::head(const weight_view& w, int64_t col0) {
  if (n_out_ == 0) return;
  const int64_t V = c_.n_vocab;
  if (col0 == 0 && w.rows == V) return mat(w, d_.xb, n_out_, d_.logits.as<float>());
  // A piece of a head cut into pieces: its logits are columns [col0, col0 + w.rows).
  mat(w, d_.xb, n_out_, d_.head.as<float>());
  for (int64_t k = 0; k < n_out_; ++k)
    cu::copy_on_device(d_.logits.as<float>() + k * V + col0, d_.head.as<float>() + k * w.rows, static_cast<size_t>(w.rows) * sizeof(float), s_);
}

void cuda_pass::drain() { st_.synchronize(); }
void cuda_pass::mark(int slot) { d_.layer_done[slot].record(s_); }
void cuda_pass::wait_mark(int slot) { d_.layer_done[slot].synchronize(); }

void cuda_pass::norm(act in, const float* w, act out) { cu::rms_norm(buf(in), w, buf(out), n_, width(in), c_.rms_eps, s_); }

void cuda_pass::matmul(act in, std::initializer_list<product> products) {
  // A decode-sized pass whose matrices all have the integer matvec quantizes the activations
  // once for them (one launch instead of three); the results are those of separate products.
  const float* x = buf(in);
  const int64_t cols = products.begin()->w->cols;
  bool shared = products.size() > 1 && n_ <= cu::k_matvec_max_rows;
  for (const product& p : products) shared = shared && cu::matvec_q8_supports(p.w->type) && p.w->cols == cols;
  if (shared && d_.gemm_scratch.size() >= cu::matvec_q8_scratch_bytes(cols, n_)) {
    cu::quantize_q8(x, n_, cols, d_.gemm_scratch.get(), d_.gemm_scratch.size(), s_);
    for (const product& p : products)
      cu::matvec_q8_quantized(p.w->type, p.w->data, p.w->rows, p.w->cols, d_.gemm_scratch.get(), d_.gemm_scratch.size(), n_, buf(p.out), s_);
    return;
  }
  for (const product& p : products) mat(*p.w, x, n_, buf(p.out));
}

void cuda_pass::matmul_swiglu(act in, const weight_view& w_gate, const weight_view& w_up, act gate, act up) {
  matmul(in, {{&w_gate, gate}, {&w_up, up}});
  cu::swiglu(buf(gate), buf(up), n_ * w_gate.rows, s_);
}

void cuda_pass::add_bias(act a, const float* b) { cu::add_rows(buf(a), b, n_, width(a), s_); }

void cuda_pass::head_norm(act a, const float* w, int64_t n_heads) { cu::rms_norm(buf(a), w, buf(a), n_ * n_heads, c_.head_dim, c_.rms_eps, s_); }

void cuda_pass::rope(act a, int64_t n_heads) {
  cu::rope(buf(a), n_, width(a), static_cast<int>(n_heads), static_cast<int>(c_.head_dim), rows_.pos, rope_, d_.freq_factors.as<float>(), s_);
}

void cuda_pass::rotate(act a, int64_t n_heads) {
  if (kv_rotate_) cu::hadamard_heads(buf(a), n_, width(a), static_cast<int>(n_heads), static_cast<int>(c_.head_dim), s_);
}

void cuda_pass::kv_store(int64_t layer, act k, act v) {
  rotate(k, c_.n_head_kv);
  rotate(v, c_.n_head_kv);
  cu::kv_store(layer_of(layer), buf(k), buf(v), n_, rows_, s_);
}

void cuda_pass::attention(int64_t layer, act q, act out) {
  rotate(q, c_.n_head);
  cu::attention(buf(q), buf(out), n_, rows_, layer_of(layer), static_cast<int>(c_.n_head), static_cast<int>(c_.n_head_kv),
                static_cast<int>(c_.head_dim), 1.0f / std::sqrt(static_cast<float>(c_.head_dim)), s_);
  rotate(out, c_.n_head);
}

void cuda_pass::add(act dst, act src) { cu::add(buf(dst), buf(src), n_ * width(dst), s_); }

}  // namespace tandem::models
