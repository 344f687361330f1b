#include "models/weight_plan.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/packed.h"
#include "kernels/cpu/quants.h"

namespace tandem::models {
namespace {

size_t align64(size_t n) { return (n + 63) / 64 * 64; }

// How a matrix (or its rows [row0, row0 + rows)) is held on the device.
struct matrix_form {
  bool packed;
  size_t bytes;
};
matrix_form form_of(const gguf_tensor& t, int64_t rows, const load_options& o) {
  const bool pack = o.pack_weights && kernels::cpu::pack_at_load(t.type);
  return {pack, pack ? kernels::cpu::packed_bytes(t.type, rows, t.ne[0]) : static_cast<size_t>(rows * kernels::row_bytes(t.type, t.ne[0]))};
}

// Appends tensors to one segment, each at the next 64-byte boundary.
class segment_builder {
 public:
  segment_builder(const gguf_file& f, const load_options& o, std::string name) : f_(f), o_(o) { s_.name = std::move(name); }

  matrix_at matrix(const std::string& name) {
    const auto& t = f_.tensor(name);
    return rows(t, 0, t.ne.size() > 1 ? t.ne[1] : 1);
  }
  matrix_at rows(const gguf_tensor& t, int64_t row0, int64_t n) {
    matrix_at m;
    m.view.type = t.type;
    m.view.rows = n;
    m.view.cols = t.ne[0];
    const auto form = form_of(t, n, o_);
    m.view.layout = form.packed ? kernels::cpu::weight_layout::packed : kernels::cpu::weight_layout::rows;
    m.offset = place(t, row0, n, form.bytes, form.packed ? tensor_form::packed : tensor_form::copy);
    return m;
  }
  size_t vector(const std::string& name) {
    const auto& t = f_.tensor(name);
    return place(t, 0, 1, static_cast<size_t>(t.elements()) * sizeof(float), tensor_form::f32);
  }
  segment_layout done() { return std::move(s_); }

 private:
  size_t place(const gguf_tensor& t, int64_t row0, int64_t n, size_t bytes, tensor_form form) {
    const size_t at = align64(s_.bytes);
    s_.tensors.push_back({&t, at, bytes, form, row0, n});
    s_.bytes = at + bytes;
    return at;
  }
  const gguf_file& f_;
  const load_options& o_;
  segment_layout s_;
};

// A table cut into pieces of whole 16-row panels of at most `cap` bytes each (at least one
// panel), one segment per piece, appended to the plan.
std::vector<matrix_piece> pieces(const gguf_file& f, const load_options& o, const std::string& tensor, const std::string& name, uint64_t cap,
                                 weight_plan& p) {
  const auto& t = f.tensor(tensor);
  const int64_t rows = t.ne.size() > 1 ? t.ne[1] : 1;
  const auto whole = form_of(t, rows, o);
  int64_t per = rows;
  if (whole.bytes > cap) {
    const auto panel = form_of(t, 16, o).bytes;
    per = std::max<int64_t>(1, static_cast<int64_t>(cap / std::max<size_t>(panel, 1))) * 16;
  }
  std::vector<matrix_piece> out;
  for (int64_t r0 = 0; r0 < rows; r0 += per) {
    const int64_t n = std::min(per, rows - r0);
    segment_builder b(f, o, per == rows ? name : name + "." + std::to_string(out.size()));
    const matrix_at m = b.rows(t, r0, n);
    out.push_back({static_cast<int>(p.segments.size()), r0, m});
    p.segments.push_back(b.done());
  }
  return out;
}

}  // namespace

uint64_t weight_plan::total_bytes() const {
  uint64_t n = 0;
  for (const auto& s : segments) n += s.bytes;
  return n;
}

uint64_t weight_plan::largest_segment() const {
  uint64_t n = 0;
  for (const auto& s : segments) n = std::max<uint64_t>(n, s.bytes);
  return n;
}

weight_plan make_weight_plan(const gguf_file& f, const model_config& c, const load_options& options) {
  // The layers are laid out first, so the tables can be cut to the largest of them; their
  // segments are numbered after the embedding pieces.
  std::vector<segment_layout> layer_segments;
  std::vector<layer_at> layers(static_cast<size_t>(c.n_layer));
  size_t output_norm = k_absent;
  uint64_t largest_layer = 0;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string n = "blk." + std::to_string(l) + ".";
    segment_builder b(f, options, "blk." + std::to_string(l));
    auto& L = layers[static_cast<size_t>(l)];
    L.attn_norm = b.vector(n + "attn_norm.weight");
    L.wq = b.matrix(n + "attn_q.weight");
    L.wk = b.matrix(n + "attn_k.weight");
    L.wv = b.matrix(n + "attn_v.weight");
    L.wo = b.matrix(n + "attn_output.weight");
    if (c.qkv_bias) {
      L.bq = b.vector(n + "attn_q.bias");
      L.bk = b.vector(n + "attn_k.bias");
      L.bv = b.vector(n + "attn_v.bias");
    }
    if (c.qk_norm) {
      L.q_norm = b.vector(n + "attn_q_norm.weight");
      L.k_norm = b.vector(n + "attn_k_norm.weight");
    }
    L.ffn_norm = b.vector(n + "ffn_norm.weight");
    L.w_gate = b.matrix(n + "ffn_gate.weight");
    L.w_up = b.matrix(n + "ffn_up.weight");
    L.w_down = b.matrix(n + "ffn_down.weight");
    // The output norm follows the last layer directly: kept with it, no segment of its own.
    if (l + 1 == c.n_layer) output_norm = b.vector("output_norm.weight");
    layer_segments.push_back(b.done());
    largest_layer = std::max<uint64_t>(largest_layer, layer_segments.back().bytes);
  }
  weight_plan p;
  p.token_embd = pieces(f, options, "token_embd.weight", "token_embd", largest_layer, p);
  p.first_layer = static_cast<int>(p.segments.size());
  for (auto& s : layer_segments) p.segments.push_back(std::move(s));
  p.layers = std::move(layers);
  p.output_norm = output_norm;
  p.output = c.tied_embeddings ? p.token_embd : pieces(f, options, "output.weight", "output", largest_layer, p);
  return p;
}

void fill_segment(const segment_layout& s, std::byte* dst) {
  for (const auto& t : s.tensors) {
    std::byte* out = dst + t.offset;
    const gguf_tensor& src = *t.src;
    const std::byte* rows = src.data.data() + t.row0 * kernels::row_bytes(src.type, src.ne[0]);
    switch (t.form) {
      case tensor_form::copy:
        std::memcpy(out, rows, t.bytes);
        break;
      case tensor_form::packed:
        kernels::cpu::pack_weights(src.type, rows, t.rows, src.ne[0], out);
        break;
      case tensor_form::f32:
        kernels::cpu::dequantize_row(src.type, src.data.data(), reinterpret_cast<float*>(out), src.elements());
        break;
    }
  }
}

weight_view bind_matrix_at(const matrix_at& m, const std::byte* base) {
  weight_view v = m.view;
  v.data = m.offset == k_absent ? nullptr : base + m.offset;
  return v;
}

const float* bind_vector_at(size_t offset, const std::byte* base) {
  return offset == k_absent ? nullptr : reinterpret_cast<const float*>(base + offset);
}

layer_weights bind_layer(const layer_at& l, const std::byte* base) {
  layer_weights w;
  w.attn_norm = bind_vector_at(l.attn_norm, base);
  w.wq = bind_matrix_at(l.wq, base);
  w.wk = bind_matrix_at(l.wk, base);
  w.wv = bind_matrix_at(l.wv, base);
  w.wo = bind_matrix_at(l.wo, base);
  w.bq = bind_vector_at(l.bq, base);
  w.bk = bind_vector_at(l.bk, base);
  w.bv = bind_vector_at(l.bv, base);
  w.q_norm = bind_vector_at(l.q_norm, base);
  w.k_norm = bind_vector_at(l.k_norm, base);
  w.ffn_norm = bind_vector_at(l.ffn_norm, base);
  w.w_gate = bind_matrix_at(l.w_gate, base);
  w.w_up = bind_matrix_at(l.w_up, base);
  w.w_down = bind_matrix_at(l.w_down, base);
  return w;
}

}  // namespace tandem::models
