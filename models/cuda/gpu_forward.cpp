#include "models/cuda/gpu_forward.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/op_table.h"
#include "models/cuda/cuda_pass.h"
#include "models/cuda/gpu_state.h"
#include "models/forward.h"
#include "models/recipe_runner.h"
#include "models/weight_plan.h"

namespace tandem::models {

using kernels::cpu::kv_type;

namespace {

// TANDEM_CUDA_GRAPHS=0 (or off, false, no) turns graph replay off, to measure what it saves.
bool graphs_off_by_env() {
  const char* v = std::getenv("TANDEM_CUDA_GRAPHS");
  if (!v) return false;
  std::string s(v);
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s == "0" || s == "off" || s == "false" || s == "no";
}

constexpr size_t k_align = 256;  // cudaMalloc's alignment, kept for every carved piece

size_t round_up(size_t n) { return (n + k_align - 1) / k_align * k_align; }

}  // namespace

// The rows' pointers are the caller's (begin, eval, decode), valid until the pass is over.
struct gpu_forward::in_flight {
  std::optional<cuda_pass> pass;
  std::optional<whole_pass_hold> whole;
  std::optional<layer_walk> walk;  // null on the graph path (replay_layers makes its own)
  weight_residency* weights = nullptr;
  bool graph = false;   // the layers and head in one advance(), replayed from a graph
  bool yields = false;  // leased weights: one layer per advance()
  const int64_t* seqs = nullptr;
  const int64_t* positions = nullptr;
  int64_t n = 0, n_out = 0;
  // The walk first (it may lease from the hold's residency), the backend last.
  void clear() {
    walk.reset();
    whole.reset();
    pass.reset();
  }
};

std::string gpu_unsupported(const model& m) {
  const auto& c = m.config();
  const weight_plan& plan = m.plan();
  for (const auto& seg : plan.segments)
    for (const auto& t : seg.tensors)
      if (t.form == tensor_form::packed)
        return "segment " + seg.name + " holds CPU-packed panels; load the model with pack_weights off for the CUDA backend";
  try {
    for (const auto& layer : plan.layers)
      for (const matrix_at* mat : {&layer.wq, &layer.wk, &layer.wv, &layer.wo, &layer.w_gate, &layer.w_up, &layer.w_down})
        kernels::require(kernels::device_kind::cuda, kernels::op::matmul, mat->view.type, "layer weights");
    for (const auto& piece : plan.token_embd) kernels::require(kernels::device_kind::cuda, kernels::op::get_rows, piece.m.view.type, "token_embd");
    for (const auto& piece : plan.output) kernels::require(kernels::device_kind::cuda, kernels::op::matmul, piece.m.view.type, "output");
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  if (c.head_dim < 1 || c.head_dim > 256 || c.n_head_kv < 1 || c.n_head % c.n_head_kv != 0)
    return "the CUDA attention takes head_dim 1..256 and n_head a multiple of n_head_kv (model: head_dim " + std::to_string(c.head_dim) + ", " +
           std::to_string(c.n_head) + " / " + std::to_string(c.n_head_kv) + " heads)";
  return {};
}

// Resident mode: the segments this object uploaded, leased without waits (they never move).
class gpu_forward::uploaded_weights final : public weight_residency {
 public:
  uploaded_weights(const std::byte* base, std::vector<size_t> offsets) : base_(base), offsets_(std::move(offsets)) {}
  const std::byte* acquire(int seg) override { return base_ + offsets_[static_cast<size_t>(seg)]; }
  void release(int) override {}
  void prefetch(int) override {}
  int prefetch_depth() const override { return 0; }
  bool fixed() const override { return true; }

 private:
  const std::byte* base_;
  std::vector<size_t> offsets_;
};

gpu_forward::gpu_forward(const model& m, const gpu_context_params& p, weight_residency* residency)
    : model_(m), residency_(residency), flight_(std::make_unique<in_flight>()) {
  const auto& c = m.config();
  const weight_plan& plan = m.plan();
  if (const std::string why = gpu_unsupported(m); !why.empty()) throw std::invalid_argument("gpu forward: " + why);
  if (std::string why; !cu::device_available(&why)) throw std::runtime_error("gpu forward: " + why);

  n_vocab_ = c.n_vocab;
  n_ctx_ = p.n_ctx > 0 ? p.n_ctx : std::min<int64_t>(c.n_ctx_train > 0 ? c.n_ctx_train : k_default_context, k_default_context);
  if (n_ctx_ < 1 || n_ctx_ > k_max_context) throw std::invalid_argument("gpu forward: context size " + std::to_string(n_ctx_) + " out of range");
  if (p.n_seq < 1 || p.n_seq > k_max_sequences) throw std::invalid_argument("gpu forward: n_seq " + std::to_string(p.n_seq) + " out of range");
  kv_pool_ = p.kv_pool;
  const int64_t bt = kv_pool_ ? kv_pool_->block_tokens() : p.block_tokens;
  if (bt < 1) throw std::invalid_argument("gpu forward: block_tokens must be positive");
  if (const std::string why = kv_type_problem(c, p.kv, p.kv_rotate); !why.empty()) throw std::invalid_argument("gpu forward: " + why);
  if (kv_pool_) {
    const uint64_t want = kv_bytes_per_token(c, p.kv) * static_cast<uint64_t>(bt);
    if (kv_pool_->block_bytes() != want)
      throw std::invalid_argument("gpu forward: KV pool blocks are " + std::to_string(kv_pool_->block_bytes()) + " bytes; this model needs " +
                                  std::to_string(want) + " for " + std::to_string(bt) + " positions");
  }
  max_batch_ = std::clamp<int64_t>(p.max_batch, 1, n_ctx_);
  const int64_t max_rows = std::max(max_batch_, p.n_seq);
  max_rows_ = max_rows;
  step_out_.reserve(static_cast<size_t>(max_rows));
  row_pos_.resize(static_cast<size_t>(max_rows));
  // eval outputs one row, decode one per sequence, a verifying pass up to max_logit_rows.
  const int64_t out_rows = std::clamp<int64_t>(p.max_logit_rows, p.n_seq, max_rows);
  max_out_ = out_rows;
  pos_.assign(static_cast<size_t>(p.n_seq), 0);
  graphs_ = p.cuda_graphs && !graphs_off_by_env();
  rope_ = rope_params_of(c, m.weights());

  // A streamed layer's kernels wait for its copy on the device, not on the host.
  if (residency_) residency_->set_device_stream(stream_.get());
  d_ = std::make_unique<gpu_device_state>(stream_.get());
  gpu_device_state& d = *d_;
  const int64_t D = c.n_embd, Q = c.q_dim(), KV = c.kv_dim(), F = c.n_ff;

  // Weights (resident mode): every segment uploaded once, in its device form.
  if (!residency_) {
    size_t total = 0;
    for (const auto& seg : plan.segments) {
      d.seg_offset.push_back(total);
      total += round_up(seg.bytes);
    }
    d.weights = cu::device_buffer(total);
    std::vector<std::byte> host;
    for (size_t i = 0; i < plan.segments.size(); ++i) {
      const auto& seg = plan.segments[i];
      host.resize(seg.bytes);
      fill_segment(seg, host.data());
      cu::copy_to_device(d.weights.as<std::byte>() + d.seg_offset[i], host.data(), seg.bytes, stream_.get());
      stream_.synchronize();  // `host` is reused for the next segment
    }
    uploaded_ = std::make_unique<uploaded_weights>(d.weights.as<std::byte>(), d.seg_offset);
  }

  // Paged KV. Sequence s's block table sits at s * blocks_per_seq in the tables buffer. Own
  // cache: s owns blocks [s * blocks_per_seq, (s + 1) * blocks_per_seq), listed once, so the
  // kernels take the same path as under an executor's pool. kv_pool: the pool's tables, copied
  // before each pass (they change as blocks are reserved, swapped or shared).
  blocks_per_seq_ = (n_ctx_ + bt - 1) / bt;
  d.part_bytes = static_cast<size_t>(kernels::cpu::kv_bytes(p.kv, bt * KV));
  d.block_bytes = 2 * static_cast<size_t>(c.n_layer) * d.part_bytes;
  d.block_stride = kv_pool_ ? kv_pool_->block_stride() : d.block_bytes;
  const int64_t n_blocks = p.n_seq * blocks_per_seq_;
  if (!kv_pool_) d.kv = cu::device_buffer(static_cast<size_t>(n_blocks) * d.block_bytes);
  d.h_tables = cu::pinned_buffer(static_cast<size_t>(n_blocks) * sizeof(int32_t));
  for (int64_t b = 0; b < n_blocks; ++b) d.h_tables.as<int32_t>()[b] = kv_pool_ ? 0 : static_cast<int32_t>(b);
  kv_ = p.kv;
  kv_rotate_ = p.kv_rotate;
  block_tokens_ = bt;

  const size_t row_ints = static_cast<size_t>(max_rows) * sizeof(int32_t);
  d.staging = cu::pinned_buffer((2 + plan.token_embd.size()) * row_ints);
  d.h_pos = d.staging.as<int32_t>();
  d.h_tor = d.h_pos + max_rows;
  d.h_rel = d.h_tor + max_rows;

  // The f16 copies of the cuBLAS path only for the products that can take it (more rows than
  // the matvec takes): decode-sized heads never do, and their f16 copy would be the largest.
  int64_t largest_piece = 0;
  size_t scratch = 0;
  for (const auto& piece : plan.output) {
    largest_piece = std::max(largest_piece, piece.m.view.rows);
    if (out_rows > cu::k_matvec_max_rows) scratch = std::max(scratch, cu::gemm::scratch_bytes(piece.m.view.rows, piece.m.view.cols, out_rows));
  }
  const bool gemm_path = max_rows > cu::k_matvec_max_rows || out_rows > cu::k_matvec_max_rows;
  if (!plan.layers.empty() && max_rows > cu::k_matvec_max_rows) {
    const auto& l = plan.layers.front();
    for (const matrix_at* mat : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
      scratch = std::max(scratch, cu::gemm::scratch_bytes(mat->view.rows, mat->view.cols, max_rows));
  }
  // Decode-sized passes: the integer matvec's int8 activations, for the widest input.
  int64_t widest = 0;
  for (const auto& piece : plan.output) widest = std::max(widest, piece.m.view.cols);
  if (!plan.layers.empty()) {
    const auto& l = plan.layers.front();
    for (const matrix_at* mat : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) widest = std::max(widest, mat->view.cols);
  }
  const int64_t decode_rows = std::min<int64_t>(std::max(max_rows, out_rows), cu::k_matvec_max_rows);
  scratch = std::max(scratch, cu::matvec_q8_scratch_bytes(widest, decode_rows));
  const int n_rot = std::min(rope_.n_rot > 0 ? rope_.n_rot : static_cast<int>(c.head_dim), static_cast<int>(c.head_dim));

  // Every buffer of the pass sized first, then carved from one allocation.
  const int64_t per_row = 2 * D + 2 * Q + 2 * KV + 2 * F;
  const std::pair<device_span*, size_t> spans[] = {
      {&d.tables, static_cast<size_t>(n_blocks) * sizeof(int32_t)},
      {&d.rel_ids, row_ints},
      {&d.pos, row_ints},
      {&d.table_of_row, row_ints},
      {&d.act, static_cast<size_t>(max_rows * per_row) * sizeof(float)},
      {&d.logits, static_cast<size_t>(out_rows * n_vocab_) * sizeof(float)},
      {&d.head, plan.output.size() > 1 ? static_cast<size_t>(out_rows * largest_piece) * sizeof(float) : 0},
      {&d.gemm_scratch, scratch},
      {&d.cublas_workspace, gemm_path ? cu::gemm::k_workspace_bytes : 0},
      {&d.freq_factors, rope_.freq_factors ? static_cast<size_t>(n_rot / 2) * sizeof(float) : 0},
  };
  size_t total = 0;
  for (const auto& [span, bytes] : spans) total += round_up(bytes);
  std::byte* base = nullptr;
  if (p.scratch_arbiter) {
    scratch_arbiter_ = p.scratch_arbiter;
    scratch_ = p.scratch_arbiter->allocate(memory::tier::device, total, {memory::owner_kind::scratch, p.owner, "activations"});
    if (!scratch_)
      throw std::runtime_error("gpu forward: the activations, logits and GEMM scratch of '" + p.owner + "' (" + std::to_string(max_rows) +
                               " rows) need " + std::to_string(total >> 20) + " MiB of device memory that the device budget no longer has");
    base = scratch_->data;
  } else {
    d.arena = cu::device_buffer(total);
    base = d.arena.as<std::byte>();
  }
  for (const auto& [span, bytes] : spans) {
    *span = {bytes ? base : nullptr, bytes};
    base += round_up(bytes);
  }
  if (d.cublas_workspace.size()) d.gemm.set_workspace(d.cublas_workspace.get(), d.cublas_workspace.size());
  if (!kv_pool_) cu::copy_to_device(d.tables.get(), d.h_tables.get(), d.h_tables.size(), stream_.get());

  float* next = d.act.as<float>();
  auto carve = [&](int64_t width) {
    float* at = next;
    next += max_rows * width;
    return at;
  };
  d.x = carve(D);
  d.xb = carve(D);
  d.q = carve(Q);
  d.k = carve(KV);
  d.v = carve(KV);
  d.attn = carve(Q);
  d.gate = carve(F);
  d.up = carve(F);
  logits_.resize(static_cast<size_t>(out_rows * n_vocab_));
  if (rope_.freq_factors) cu::copy_to_device(d.freq_factors.get(), rope_.freq_factors, d.freq_factors.size(), stream_.get());
  stream_.synchronize();
}

gpu_forward::~gpu_forward() {
  // Work still queued reads buffers freed below: let it finish (errors were reported already).
  try {
    stream_.synchronize();
  } catch (...) {
  }
  if (scratch_) scratch_arbiter_->release(*scratch_);
  if (residency_) residency_->set_device_stream(nullptr);  // the stream goes with this object
}

uint64_t gpu_forward::device_bytes() const {
  const gpu_device_state& d = *d_;
  return d.weights.size() + d.kv.size() + (scratch_ ? scratch_->bytes : d.arena.size());
}

std::span<const float> gpu_forward::logits() const { return {logits_.data() + (n_logit_rows_ - 1) * n_vocab_, static_cast<size_t>(n_vocab_)}; }

void gpu_forward::check_seq(int64_t seq) const {
  if (seq < 0 || seq >= static_cast<int64_t>(pos_.size()))
    throw std::invalid_argument("sequence " + std::to_string(seq) + " out of range [0, " + std::to_string(pos_.size()) + ")");
}

void gpu_forward::eval(std::span<const int32_t> tokens, int64_t seq) {
  check_seq(seq);
  if (tokens.empty()) throw std::invalid_argument("eval: no tokens");
  for (const int32_t t : tokens)
    if (t < 0 || t >= n_vocab_) throw std::invalid_argument("token id " + std::to_string(t) + " out of range [0, " + std::to_string(n_vocab_) + ")");
  const int64_t n = static_cast<int64_t>(tokens.size());
  check_capacity(seq, pos(seq) + n);
  std::vector<int64_t> seqs(static_cast<size_t>(max_batch_), seq), positions(static_cast<size_t>(max_batch_));
  for (int64_t done = 0; done < n;) {
    const int64_t chunk = std::min(max_batch_, n - done);
    for (int64_t r = 0; r < chunk; ++r) positions[static_cast<size_t>(r)] = pos(seq) + r;
    const int64_t last = chunk - 1;
    const bool final_chunk = done + chunk == n;
    run(tokens.data() + done, seqs.data(), positions.data(), chunk, final_chunk ? &last : nullptr, final_chunk ? 1 : 0);
    done += chunk;
  }
}

void gpu_forward::decode(std::span<const int32_t> tokens, std::span<const int64_t> seqs) {
  if (tokens.size() != seqs.size() || tokens.empty()) throw std::invalid_argument("decode: tokens and sequences differ in length or are empty");
  if (tokens.size() > pos_.size()) throw std::invalid_argument("decode: more rows than sequences");
  std::vector<int64_t> positions(tokens.size()), out(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    check_seq(seqs[i]);
    for (size_t j = 0; j < i; ++j)
      if (seqs[j] == seqs[i]) throw std::invalid_argument("decode: sequence " + std::to_string(seqs[i]) + " listed twice");
    if (tokens[i] < 0 || tokens[i] >= n_vocab_) throw std::invalid_argument("token id " + std::to_string(tokens[i]) + " out of range");
    check_capacity(seqs[i], pos(seqs[i]) + 1);
    positions[i] = pos(seqs[i]);
    out[i] = static_cast<int64_t>(i);
  }
  const auto n = static_cast<int64_t>(tokens.size());
  run(tokens.data(), seqs.data(), positions.data(), n, out.data(), n);
}

void gpu_forward::check_capacity(int64_t seq, int64_t end) const {
  if (end > n_ctx_)
    throw std::invalid_argument("context overflow: sequence " + std::to_string(seq) + " would hold " + std::to_string(end) + " of " +
                                std::to_string(n_ctx_) + " positions");
  if (!kv_pool_ || kv_pool_->capacity(seq) >= end) return;
  throw std::invalid_argument("sequence " + std::to_string(seq) + " needs KV blocks for " + std::to_string(end) + " positions but holds " +
                              std::to_string(kv_pool_->capacity(seq)) + (kv_pool_->swapped_out(seq) ? " (swapped out)" : "") +
                              "; reserve them in the KV pool first");
}

void gpu_forward::upload_tables(const int64_t* seqs, int64_t n) {
  gpu_device_state& d = *d_;
  int32_t* h = d.h_tables.as<int32_t>();
  for (int64_t r = 0; r < n; ++r) {
    if (r > 0 && seqs[r] == seqs[r - 1]) continue;
    const auto& t = kv_pool_->table(seqs[r]);
    const auto len = std::min<int64_t>(static_cast<int64_t>(t.size()), blocks_per_seq_);
    std::copy_n(t.data(), len, h + seqs[r] * blocks_per_seq_);
    cu::copy_to_device(d.tables.as<int32_t>() + seqs[r] * blocks_per_seq_, h + seqs[r] * blocks_per_seq_, static_cast<size_t>(len) * sizeof(int32_t),
                       stream_.get());
  }
}

void gpu_forward::assume(int64_t pos, int64_t seq) {
  check_seq(seq);
  check_assume(pos, seq, pos_[static_cast<size_t>(seq)], n_ctx_, kv_pool_ ? kv_pool_->capacity(seq) : -1);
  pos_[static_cast<size_t>(seq)] = pos;
}

void gpu_forward::truncate(int64_t pos, int64_t seq) {
  check_seq(seq);
  int64_t& p = pos_[static_cast<size_t>(seq)];
  if (pos < 0 || pos > p) throw std::invalid_argument("truncate: position " + std::to_string(pos) + " is outside [0, " + std::to_string(p) + "]");
  p = pos;
}

void gpu_forward::begin(std::span<const int32_t> tokens, std::span<const int64_t> seqs, std::span<const int64_t> logit_rows) {
  flight_->clear();
  if (tokens.empty() && seqs.empty()) return;
  lay_out_step(
      tokens, seqs, logit_rows, n_vocab_, max_rows_, max_out_,
      [this](int64_t s) {
        check_seq(s);
        return pos(s);
      },
      [this](int64_t s, int64_t need) { check_capacity(s, need); }, step_out_, row_pos_.data());
  begin_run(tokens.data(), seqs.data(), row_pos_.data(), static_cast<int64_t>(tokens.size()), step_out_.data(),
            static_cast<int64_t>(step_out_.size()));
}

void gpu_forward::run(const int32_t* tokens, const int64_t* seqs, const int64_t* positions, int64_t n, const int64_t* out_rows, int64_t n_out) {
  begin_run(tokens, seqs, positions, n, out_rows, n_out);
  while (!advance()) {
  }
}

void gpu_forward::begin_run(const int32_t* tokens, const int64_t* seqs, const int64_t* positions, int64_t n, const int64_t* out_rows, int64_t n_out) {
  const auto& c = model_.config();
  gpu_device_state& d = *d_;
  const cu::stream_t s = stream_.get();
  in_flight& f = *flight_;
  f.clear();
  for (int64_t r = 0; r < n; ++r) {
    d.h_pos[r] = static_cast<int32_t>(positions[r]);
    d.h_tor[r] = static_cast<int32_t>(seqs[r] * blocks_per_seq_);
  }
  const size_t row_ints = static_cast<size_t>(n) * sizeof(int32_t);
  cu::copy_to_device(d.pos.get(), d.h_pos, row_ints, s);
  cu::copy_to_device(d.table_of_row.get(), d.h_tor, row_ints, s);
  if (kv_pool_) upload_tables(seqs, n);

  const int64_t max_rows = std::max(max_batch_, static_cast<int64_t>(pos_.size()));
  std::byte* kv_base = kv_pool_ ? kv_pool_->data() : d.kv.as<std::byte>();
  cuda_pass& pass = f.pass.emplace(c, d, stream_, rope_, kv_, kv_rotate_, kv_base, block_tokens_, tokens, n, out_rows, n_out, max_rows);
  f.weights = residency_ ? residency_ : uploaded_.get();
  // A model whose segments are all on the device holds them for the pass: no per-layer
  // lease, and they stay put, so its decode passes replay graphs as resident weights do.
  const bool fixed_weights = !residency_ || static_cast<bool>(f.whole.emplace(residency_));
  f.seqs = seqs;
  f.positions = positions;
  f.n = n;
  f.n_out = n_out;
  try {
    run_embedding(pass, model_, f.weights, {tokens, static_cast<size_t>(n)});
    // A decode-sized pass whose logits rows are its rows in order (a decode step, or one
    // token of `eval`) is the same work every time but for the contents of pos,
    // table_of_row and x: its layers and head are replayed from a graph captured the first
    // time (fixed weights only, since streaming waits on the host between layers). The
    // embedding depends on the tokens, so it always runs apart.
    bool in_order = n_out == n;
    for (int64_t k = 0; k < n_out && in_order; ++k) in_order = out_rows[k] == k;
    f.graph = graphs_ && fixed_weights && in_order && n <= cu::k_matvec_max_rows;
    // Leased weights: one layer per advance(), so another model's passes may run between
    // layers (its kernels queue on its own stream behind nothing of this pass but the layer
    // already queued). Never inside a graph capture.
    f.yields = !fixed_weights;
    if (!f.graph) f.walk.emplace(recipe_for(c), pass, model_, f.weights, n_out > 0);
  } catch (...) {
    f.clear();
    throw;
  }
}

bool gpu_forward::advance() {
  in_flight& f = *flight_;
  if (!f.pass) return true;  // nothing begun (an empty step)
  try {
    if (f.graph)
      replay_layers();
    else if (f.yields) {
      if (!f.walk->advance()) return false;
    } else
      f.walk->finish();
    end_run();
  } catch (...) {
    f.clear();
    throw;
  }
  f.clear();
  return true;
}

void gpu_forward::replay_layers() {
  in_flight& f = *flight_;
  gpu_device_state& d = *d_;
  const cu::stream_t s = stream_.get();
  auto layers = [&] { layer_walk(recipe_for(model_.config()), *f.pass, model_, f.weights, f.n_out > 0).finish(); };
  // A graph holds the weights' device addresses: one the arbiter has moved since (an
  // eviction and a reload) is captured again.
  if (residency_) {
    std::vector<const std::byte*>& bases = d.graph_bases;
    bool moved = bases.size() != model_.plan().segments.size();
    bases.resize(model_.plan().segments.size());
    for (size_t i = 0; i < bases.size(); ++i) {
      const std::byte* b = residency_->acquire(static_cast<int>(i));
      residency_->release(static_cast<int>(i));
      moved = moved || b != bases[i];
      bases[i] = b;
    }
    if (moved)
      for (auto& g : d.graphs) g = cu::graph();
  }
  cu::graph& g = d.graphs[static_cast<size_t>(f.n)];
  if (!g) {
    cu::graph::begin_capture(s);
    try {
      layers();
    } catch (...) {
      cu::graph::abort_capture(s);
      throw;
    }
    try {
      g = cu::graph::end_capture(s);
    } catch (const std::exception&) {
      // Captured work never ran. A capture the driver refuses (or cannot instantiate) is
      // not this pass's failure: run it launch by launch, and from now on always.
      graphs_ = false;
    }
  }
  if (g)
    g.launch(s);
  else
    layers();
}

void gpu_forward::end_run() {
  const in_flight& f = *flight_;
  if (f.n_out == 0) {
    stream_.synchronize();  // a prompt chunk that is not the last: report failures now
    for (int64_t r = 0; r < f.n; ++r) pos_[static_cast<size_t>(f.seqs[r])] = f.positions[r] + 1;
    return;
  }
  cu::copy_to_host(logits_.data(), d_->logits.get(), static_cast<size_t>(f.n_out * n_vocab_) * sizeof(float), stream_.get());
  stream_.synchronize();
  // Positions move only once the pass has run: a failure leaves the sequences where they were.
  for (int64_t r = 0; r < f.n; ++r) pos_[static_cast<size_t>(f.seqs[r])] = f.positions[r] + 1;
  n_logit_rows_ = f.n_out;
}

}  // namespace tandem::models
