#include "models/model.h"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <thread>
#include <utility>

#include "kernels/cpu/quants.h"
#include "kernels/cpu/thread_pool.h"
#include "models/tokenizer.h"
#include "models/weight_plan.h"

namespace tandem::models {
namespace {

std::string computable_types() {
  std::string s;
  for (uint32_t id = 0; id < 64; ++id)
    if (auto i = kernels::find_weight_type(id); i && i->computable) s += (s.empty() ? "" : ", ") + kernels::display_name(i->type);
  return s;
}

weight_view bind_matrix(const gguf_file& f, const std::string& name) {
  const auto& t = f.tensor(name);
  const auto& ti = kernels::info(t.type);
  if (!ti.computable)
    throw gguf_error(f.path() + ": tensor '" + name + "' has type " + kernels::display_name(t.type) +
                     ", which tandem cannot compute (supported: " + computable_types() + ")");
  return {t.data.data(), t.type, t.ne.size() > 1 ? t.ne[1] : 1, t.ne[0]};
}

// Converts a 1-D tensor to F32 into storage owned by the weights.
const float* bind_vector(const gguf_file& f, const std::string& name, model_weights& w) {
  const auto& t = f.tensor(name);
  using kernels::weight_type;
  if (t.type != weight_type::f32 && t.type != weight_type::f16 && t.type != weight_type::bf16)
    throw gguf_error(f.path() + ": tensor '" + name + "' has type " + kernels::display_name(t.type) + ", expected a float type (F32, F16 or BF16)");
  auto& buf = w.owned.emplace_back(static_cast<size_t>(t.elements()));
  kernels::cpu::dequantize_row(t.type, t.data.data(), buf.data(), t.elements());
  return buf.data();
}

// rope_freqs divide each pair's rotation frequency: zero, negative or non-finite divisors
// would turn every rotated dimension into NaN or nonsense.
const float* bind_rope_freqs(const gguf_file& f, model_weights& w) {
  const float* v = bind_vector(f, "rope_freqs.weight", w);
  const int64_t n = f.tensor("rope_freqs.weight").elements();
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(v[i]) || !(v[i] > 0))
      throw gguf_error(f.path() + ": tensor 'rope_freqs.weight': element " + std::to_string(i) + " is " + std::to_string(v[i]) +
                       ", expected a finite positive divisor");
  return v;
}

// Repacks the matrices whose kernels gain from it into panels in one huge-page buffer owned by
// the weights, then lets the kernel reclaim the file pages they came from, so the weights are
// not resident twice. A view listed twice (a tied output head) is packed once.
void pack_all(const std::vector<weight_view*>& views, model_weights& w, const gguf_file& f) {
  auto wanted = [](const weight_view& v) { return kernels::cpu::pack_at_load(v.type) && v.layout == kernels::cpu::weight_layout::rows; };
  auto at64 = [](size_t n) { return (n + 63) / 64 * 64; };
  size_t total = 0;
  for (const weight_view* v : views)
    if (wanted(*v)) total += at64(kernels::cpu::packed_bytes(v->type, v->rows, v->cols));
  if (total == 0) return;
  w.packed = memory::huge_buffer(total);
  // Each matrix's place in the buffer, then the matrices packed in parallel (a few GB of
  // weights would take tens of seconds on one thread).
  std::vector<std::pair<weight_view*, uint8_t*>> jobs;
  auto* out = reinterpret_cast<uint8_t*>(w.packed.data());
  for (weight_view* v : views) {
    if (!wanted(*v)) continue;
    jobs.emplace_back(v, out);
    out += at64(kernels::cpu::packed_bytes(v->type, v->rows, v->cols));
  }
  const auto threads = static_cast<int>(std::clamp<size_t>(std::thread::hardware_concurrency(), 1, jobs.size()));
  kernels::cpu::thread_pool pool(threads);
  pool.parallel_for(static_cast<int64_t>(jobs.size()), 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      auto [v, dst] = jobs[static_cast<size_t>(i)];
      kernels::cpu::pack_weights(v->type, v->data, v->rows, v->cols, dst);
      f.drop_pages({static_cast<const std::byte*>(v->data), static_cast<size_t>(v->rows * kernels::row_bytes(v->type, v->cols))});
      v->data = dst;
      v->layout = kernels::cpu::weight_layout::packed;
    }
  });
}

}  // namespace

void dequantize_weight_row(const weight_view& w, int64_t row, float* out) {
  if (w.layout == kernels::cpu::weight_layout::packed) {
    kernels::cpu::dequantize_packed_row(w.type, w.data, w.cols, row, out);
    return;
  }
  const auto* p = static_cast<const std::byte*>(w.data) + row * kernels::row_bytes(w.type, w.cols);
  kernels::cpu::dequantize_row(w.type, p, out, w.cols);
}

model::~model() = default;

model::model(const std::string& path, const load_options& options) : file_(path), config_(read_model_config(file_)), options_(options) {
  const auto& c = config_;
  auto& w = weights_;
  w.token_embd = bind_matrix(file_, "token_embd.weight");
  w.output = c.tied_embeddings ? w.token_embd : bind_matrix(file_, "output.weight");
  w.output_norm = bind_vector(file_, "output_norm.weight", w);
  if (c.has_rope_freqs) w.rope_freqs = bind_rope_freqs(file_, w);
  w.layers.resize(c.n_layer);
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    auto& L = w.layers[l];
    L.attn_norm = bind_vector(file_, b + "attn_norm.weight", w);
    L.wq = bind_matrix(file_, b + "attn_q.weight");
    L.wk = bind_matrix(file_, b + "attn_k.weight");
    L.wv = bind_matrix(file_, b + "attn_v.weight");
    L.wo = bind_matrix(file_, b + "attn_output.weight");
    if (c.qkv_bias) {
      L.bq = bind_vector(file_, b + "attn_q.bias", w);
      L.bk = bind_vector(file_, b + "attn_k.bias", w);
      L.bv = bind_vector(file_, b + "attn_v.bias", w);
    }
    if (c.qk_norm) {
      L.q_norm = bind_vector(file_, b + "attn_q_norm.weight", w);
      L.k_norm = bind_vector(file_, b + "attn_k_norm.weight", w);
    }
    L.ffn_norm = bind_vector(file_, b + "ffn_norm.weight", w);
    L.w_gate = bind_matrix(file_, b + "ffn_gate.weight");
    L.w_up = bind_matrix(file_, b + "ffn_up.weight");
    L.w_down = bind_matrix(file_, b + "ffn_down.weight");
  }
  // After the bindings above, which validate every tensor the plan places.
  plan_ = std::make_unique<weight_plan>(make_weight_plan(file_, c, options));
  if (options.pack_weights && options.own_weights) {
    // A tied output head is the embedding table: packed once, looked up through the panels.
    std::vector<weight_view*> views{&w.output};
    for (auto& L : w.layers)
      for (weight_view* v : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down}) views.push_back(v);
    pack_all(views, w, file_);
    if (c.tied_embeddings) w.token_embd = w.output;
  }
}

uint64_t model::weight_bytes() const {
  uint64_t n = 0;
  for (const auto& t : file_.tensors()) n += t.bytes;
  return n;
}

void check_tokenizer_matches(const tokenizer& tok, const model_config& c, const std::string& path) {
  if (tok.n_vocab() != c.n_vocab)
    throw gguf_error(path + ": the tokenizer has " + std::to_string(tok.n_vocab()) + " tokens but the model's vocabulary (token_embd.weight) has " +
                     std::to_string(c.n_vocab) + "; they must be equal");
}

}  // namespace tandem::models
