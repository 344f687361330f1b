#include "models/cuda/gpu_forward.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <initializer_list>
#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/op_table.h"
#include "models/forward.h"
#include "models/weight_plan.h"

namespace tandem::models {

namespace cu = kernels::cuda;
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
size_t elem_bytes(kv_type t) { return t == kv_type::f16 ? 2 : 4; }

}  // namespace

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

// Device memory of the pass: everything is sized at construction, so eval and decode only
// enqueue kernels and copies.
struct gpu_forward::device_state {
  explicit device_state(cu::stream_t s) : gemm(s) {}
  cu::gemm gemm;
  cu::device_buffer weights;        // resident mode: every segment, at seg_offset
  std::vector<size_t> seg_offset;
  cu::device_buffer kv;             // n_seq * blocks_per_seq blocks
  cu::device_buffer tables;         // int32 block ids, blocks_per_seq per sequence
  cu::device_buffer rel_ids, pos, table_of_row;  // int32 per row
  cu::device_buffer act;            // x, xb, q, k, v, attn, gate, up (max_rows each)
  cu::device_buffer logits, head;   // [out rows][n_vocab], [out rows][largest head piece]
  cu::device_buffer gemm_scratch;
  cu::device_buffer freq_factors;
  cu::graph graphs[cu::k_matvec_max_rows + 1];  // by rows of the pass (gpu_forward::run)
  cu::event layer_done[2];                       // after the kernels of layers l and l-1 (streaming)
  float *x = nullptr, *xb = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *attn = nullptr, *gate = nullptr, *up = nullptr;
  size_t block_bytes = 0, part_bytes = 0;  // a KV block; one layer's K (or V) rows in it
  // Pinned staging of the per-row arrays, so their copies overlap: positions and table
  // offsets, then one array of relative ids per embedding piece (a piece's ids must not be
  // rewritten while an earlier piece's copy is still queued). Every pass ends synchronised,
  // so the next one may rewrite them all.
  cu::pinned_buffer staging;
  cu::pinned_buffer h_tables;       // int32, blocks_per_seq per sequence
  int32_t *h_pos = nullptr, *h_tor = nullptr, *h_rel = nullptr;
};

gpu_forward::gpu_forward(const model& m, const gpu_context_params& p, weight_residency* residency)
    : model_(m), residency_(residency) {
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
  const int64_t out_rows = p.n_seq;  // eval outputs one row, decode one per sequence
  pos_.assign(static_cast<size_t>(p.n_seq), 0);
  graphs_ = p.cuda_graphs && !graphs_off_by_env();
  rope_ = rope_params_of(c, m.weights());

  d_ = std::make_unique<device_state>(stream_.get());
  device_state& d = *d_;
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
  }

  // Paged KV. Sequence s's block table sits at s * blocks_per_seq in the tables buffer. Own
  // cache: s owns blocks [s * blocks_per_seq, (s + 1) * blocks_per_seq), listed once, so the
  // kernels take the same path as under an executor's pool. kv_pool: the pool's tables, copied
  // before each pass (they change as blocks are reserved, swapped or shared).
  blocks_per_seq_ = (n_ctx_ + bt - 1) / bt;
  const size_t eb = elem_bytes(p.kv);
  d.part_bytes = static_cast<size_t>(bt * KV) * eb;
  d.block_bytes = 2 * static_cast<size_t>(c.n_layer) * d.part_bytes;
  const int64_t n_blocks = p.n_seq * blocks_per_seq_;
  if (!kv_pool_) d.kv = cu::device_buffer(static_cast<size_t>(n_blocks) * d.block_bytes);
  d.tables = cu::device_buffer(static_cast<size_t>(n_blocks) * sizeof(int32_t));
  d.h_tables = cu::pinned_buffer(static_cast<size_t>(n_blocks) * sizeof(int32_t));
  for (int64_t b = 0; b < n_blocks; ++b) d.h_tables.as<int32_t>()[b] = kv_pool_ ? 0 : static_cast<int32_t>(b);
  if (!kv_pool_) cu::copy_to_device(d.tables.get(), d.h_tables.get(), d.h_tables.size(), stream_.get());
  kv_ = p.kv;
  block_tokens_ = bt;

  const size_t row_ints = static_cast<size_t>(max_rows) * sizeof(int32_t);
  d.rel_ids = cu::device_buffer(row_ints);
  d.pos = cu::device_buffer(row_ints);
  d.table_of_row = cu::device_buffer(row_ints);
  d.staging = cu::pinned_buffer((2 + plan.token_embd.size()) * row_ints);
  d.h_pos = d.staging.as<int32_t>();
  d.h_tor = d.h_pos + max_rows;
  d.h_rel = d.h_tor + max_rows;

  const int64_t per_row = 2 * D + 2 * Q + 2 * KV + 2 * F;
  d.act = cu::device_buffer(static_cast<size_t>(max_rows * per_row) * sizeof(float));
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

  // The f16 copies of the cuBLAS path only for the products that can take it (more rows than
  // the matvec takes): decode-sized heads never do, and their f16 copy would be the largest.
  int64_t largest_piece = 0;
  size_t scratch = 0;
  for (const auto& piece : plan.output) {
    largest_piece = std::max(largest_piece, piece.m.view.rows);
    if (out_rows > cu::k_matvec_max_rows)
      scratch = std::max(scratch, cu::gemm::scratch_bytes(piece.m.view.rows, piece.m.view.cols, out_rows));
  }
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
    for (const matrix_at* mat : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down})
      widest = std::max(widest, mat->view.cols);
  }
  const int64_t decode_rows = std::min<int64_t>(std::max(max_rows, out_rows), cu::k_matvec_max_rows);
  scratch = std::max(scratch, cu::matvec_q8_scratch_bytes(widest, decode_rows));
  d.gemm_scratch = cu::device_buffer(scratch);
  d.logits = cu::device_buffer(static_cast<size_t>(out_rows * n_vocab_) * sizeof(float));
  if (plan.output.size() > 1) d.head = cu::device_buffer(static_cast<size_t>(out_rows * largest_piece) * sizeof(float));
  logits_.resize(static_cast<size_t>(out_rows * n_vocab_));

  if (rope_.freq_factors) {
    const int n_rot = std::min(rope_.n_rot > 0 ? rope_.n_rot : static_cast<int>(c.head_dim), static_cast<int>(c.head_dim));
    const size_t bytes = static_cast<size_t>(n_rot / 2) * sizeof(float);
    d.freq_factors = cu::device_buffer(bytes);
    cu::copy_to_device(d.freq_factors.get(), rope_.freq_factors, bytes, stream_.get());
  }
  stream_.synchronize();
}

gpu_forward::~gpu_forward() {
  // Work still queued reads buffers freed below: let it finish (errors were reported already).
  try {
    stream_.synchronize();
  } catch (...) {
  }
}

uint64_t gpu_forward::device_bytes() const {
  const device_state& d = *d_;
  uint64_t n = 0;
  for (const cu::device_buffer* b : {&d.weights, &d.kv, &d.tables, &d.rel_ids, &d.pos, &d.table_of_row, &d.act, &d.logits,
                                     &d.head, &d.gemm_scratch, &d.freq_factors})
    n += b->size();
  return n;
}

std::span<const float> gpu_forward::logits() const {
  return {logits_.data() + (n_logit_rows_ - 1) * n_vocab_, static_cast<size_t>(n_vocab_)};
}

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
  device_state& d = *d_;
  int32_t* h = d.h_tables.as<int32_t>();
  for (int64_t r = 0; r < n; ++r) {
    if (r > 0 && seqs[r] == seqs[r - 1]) continue;
    const auto& t = kv_pool_->table(seqs[r]);
    const auto len = std::min<int64_t>(static_cast<int64_t>(t.size()), blocks_per_seq_);
    std::copy_n(t.data(), len, h + seqs[r] * blocks_per_seq_);
    cu::copy_to_device(d.tables.as<int32_t>() + seqs[r] * blocks_per_seq_, h + seqs[r] * blocks_per_seq_,
                       static_cast<size_t>(len) * sizeof(int32_t), stream_.get());
  }
}

void gpu_forward::assume(int64_t pos, int64_t seq) {
  check_seq(seq);
  check_assume(pos, seq, pos_[static_cast<size_t>(seq)], n_ctx_, kv_pool_ ? kv_pool_->capacity(seq) : -1);
  pos_[static_cast<size_t>(seq)] = pos;
}

void gpu_forward::step(std::span<const int32_t> tokens, std::span<const int64_t> seqs) {
  if (tokens.empty() && seqs.empty()) return;
  lay_out_step(
      tokens, seqs, n_vocab_, max_rows_,
      [this](int64_t s) {
        check_seq(s);
        return pos(s);
      },
      [this](int64_t s, int64_t need) { check_capacity(s, need); }, step_out_, row_pos_.data());
  run(tokens.data(), seqs.data(), row_pos_.data(), static_cast<int64_t>(tokens.size()), step_out_.data(),
      static_cast<int64_t>(step_out_.size()));
}

gpu_forward::lease::lease(gpu_forward& f, int seg) : f_(&f), seg_(seg), base(f.acquire(seg)) {}

gpu_forward::lease& gpu_forward::lease::operator=(lease&& o) noexcept {
  if (this != &o) {
    end();
    f_ = std::exchange(o.f_, nullptr);
    seg_ = o.seg_;
    base = o.base;
  }
  return *this;
}

void gpu_forward::lease::end_after(const cu::event& done) {
  if (!f_) return;
  gpu_forward* f = std::exchange(f_, nullptr);
  try {
    done.synchronize();
  } catch (...) {
    f->residency_->release(seg_);  // the stream failed: nothing more reads the segment
    throw;
  }
  f->residency_->release(seg_);
}

void gpu_forward::lease::end() noexcept {
  if (!f_) return;
  // Also on unwind: a lease left open would pin its stream slot for good. When the stream has
  // failed, nothing more runs on it, so the segment is free to go either way.
  try {
    f_->release(seg_);
  } catch (...) {
    if (f_->residency_) f_->residency_->release(seg_);
  }
  f_ = nullptr;
}

const std::byte* gpu_forward::acquire(int seg) {
  if (!residency_) return d_->weights.as<std::byte>() + d_->seg_offset[static_cast<size_t>(seg)];
  const std::byte* p = residency_->acquire(seg);
  if (!p) throw std::logic_error("gpu forward: segment " + std::to_string(seg) + " cannot be had (streaming not prepared)");
  return p;
}

void gpu_forward::release(int seg) {
  if (!residency_) return;
  // The kernels reading the segment are only queued: they must have run before the arbiter
  // may reuse its memory. The copies of the next segments keep going meanwhile.
  stream_.synchronize();
  residency_->release(seg);
}

void gpu_forward::run(const int32_t* tokens, const int64_t* seqs, const int64_t* positions, int64_t n, const int64_t* out_rows,
                      int64_t n_out) {
  const auto& c = model_.config();
  const weight_plan& plan = model_.plan();
  device_state& d = *d_;
  const cu::stream_t s = stream_.get();
  const int64_t D = c.n_embd;
  if (residency_) {
    const int depth = residency_->prefetch_depth();
    for (int k = 0; k < depth && k < c.n_layer; ++k) residency_->prefetch(plan.layer_segment(k));
  }

  for (int64_t r = 0; r < n; ++r) {
    d.h_pos[r] = static_cast<int32_t>(positions[r]);
    d.h_tor[r] = static_cast<int32_t>(seqs[r] * blocks_per_seq_);
  }
  const size_t row_ints = static_cast<size_t>(n) * sizeof(int32_t);
  cu::copy_to_device(d.pos.get(), d.h_pos, row_ints, s);
  cu::copy_to_device(d.table_of_row.get(), d.h_tor, row_ints, s);
  if (kv_pool_) upload_tables(seqs, n);

  // Token embedding, piece by piece: each run of rows whose tokens fall in a piece is one
  // gather with ids relative to the piece.
  const int64_t max_rows = std::max(max_batch_, static_cast<int64_t>(pos_.size()));
  for (size_t pi = 0; pi < plan.token_embd.size(); ++pi) {
    const auto& piece = plan.token_embd[pi];
    const int64_t end = piece.row0 + piece.m.view.rows;
    auto in_piece = [&](int64_t r) { return tokens[r] >= piece.row0 && tokens[r] < end; };
    bool wanted = false;
    for (int64_t r = 0; r < n && !wanted; ++r) wanted = in_piece(r);
    if (!wanted) continue;
    const lease held(*this, piece.segment);
    const weight_view table = bind_matrix_at(piece.m, held.base);
    int32_t* rel = d.h_rel + static_cast<int64_t>(pi) * max_rows;
    for (int64_t r = 0; r < n; ++r) rel[r] = static_cast<int32_t>(tokens[r] - piece.row0);
    cu::copy_to_device(d.rel_ids.get(), rel, row_ints, s);
    for (int64_t r0 = 0; r0 < n;) {
      if (!in_piece(r0)) {
        ++r0;
        continue;
      }
      int64_t r1 = r0 + 1;
      while (r1 < n && in_piece(r1)) ++r1;
      cu::get_rows(table.type, table.data, D, d.rel_ids.as<int32_t>() + r0, r1 - r0, d.x + r0 * D, s);
      r0 = r1;
    }
  }

  // A decode-sized pass whose logits rows are its rows in order (a decode step, or one token
  // of `generate`) is the same work every time but for the contents of pos, table_of_row and
  // x: replayed from a graph captured the first time (resident weights only, since streaming
  // waits on the host between layers).
  bool in_order = n_out == n;
  for (int64_t k = 0; k < n_out && in_order; ++k) in_order = out_rows[k] == k;
  if (graphs_ && !residency_ && in_order && n <= cu::k_matvec_max_rows) {
    cu::graph& g = d.graphs[static_cast<size_t>(n)];
    if (!g) {
      cu::graph::begin_capture(s);
      try {
        body(n, out_rows, n_out);
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
      body(n, out_rows, n_out);
  } else {
    body(n, out_rows, n_out);
  }
  if (n_out == 0) {
    stream_.synchronize();  // a prompt chunk that is not the last: report failures now
    for (int64_t r = 0; r < n; ++r) pos_[static_cast<size_t>(seqs[r])] = positions[r] + 1;
    return;
  }
  cu::copy_to_host(logits_.data(), d.logits.get(), static_cast<size_t>(n_out * n_vocab_) * sizeof(float), s);
  stream_.synchronize();
  // Positions move only once the pass has run: a failure leaves the sequences where they were.
  for (int64_t r = 0; r < n; ++r) pos_[static_cast<size_t>(seqs[r])] = positions[r] + 1;
  n_logit_rows_ = n_out;
}

void gpu_forward::body(int64_t n, const int64_t* out_rows, int64_t n_out) {
  const auto& c = model_.config();
  const weight_plan& plan = model_.plan();
  device_state& d = *d_;
  const cu::stream_t s = stream_.get();
  const int64_t D = c.n_embd, Q = c.q_dim(), KV = c.kv_dim(), F = c.n_ff, hd = c.head_dim;
  const int depth = residency_ ? residency_->prefetch_depth() : 0;
  const cu::row_map rows{d.pos.as<int32_t>(), d.tables.as<int32_t>(), d.table_of_row.as<int32_t>()};
  auto mat = [&](const weight_view& w, const float* x, int64_t n_x, float* y) {
    d.gemm.run(w.type, w.data, w.rows, w.cols, x, n_x, y, d.gemm_scratch.get(), d.gemm_scratch.size());
  };
  // Products over the same activations (Q, K, V; gate and up). A decode-sized pass whose
  // matrices all have the integer matvec quantizes the activations once for them (one launch
  // instead of three); the results are those of separate products, bit for bit.
  auto mats = [&](const float* x, int64_t n_x, std::initializer_list<std::pair<const weight_view*, float*>> products) {
    bool shared = n_x <= cu::k_matvec_max_rows;
    const int64_t cols = products.begin()->first->cols;
    for (const auto& [w, y] : products) shared = shared && cu::matvec_q8_supports(w->type) && w->cols == cols;
    if (shared && d.gemm_scratch.size() >= cu::matvec_q8_scratch_bytes(cols, n_x)) {
      cu::quantize_q8(x, n_x, cols, d.gemm_scratch.get(), d.gemm_scratch.size(), s);
      for (const auto& [w, y] : products)
        cu::matvec_q8_quantized(w->type, w->data, w->rows, w->cols, d.gemm_scratch.get(), d.gemm_scratch.size(), n_x, y, s);
      return;
    }
    for (const auto& [w, y] : products) mat(*w, x, n_x, y);
  };

  const float attn_scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // Streaming with a prefetch depth of 1 or more (so at least two stream slots): layer l's
  // segment is acquired, its copy waited for on the host, while the GPU still computes layer
  // l-1, whose segment goes back once an event after its kernels has passed, not once the
  // whole stream has drained. The GPU then never waits for the host between layers. With
  // depth 0 there is one slot: a segment goes back before the next one is asked for.
  const bool overlap = residency_ && depth >= 1;
  auto prefetch_after = [&](int seg, int ahead) {
    for (int k = 1; k <= ahead && seg + k <= plan.last_segment(); ++k) residency_->prefetch(seg + k);
  };
  lease layer_held, prev_held;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const int seg = plan.layer_segment(l);
    if (overlap)
      prev_held = std::move(layer_held);
    else
      layer_held = lease();  // hand the slot back before asking for the next segment
    // The last layer's segment also holds the output norm: it stays held past the loop.
    layer_held = lease(*this, seg);
    const std::byte* last_base = layer_held.base;
    // While the previous layer is still held one slot fewer is free: asking for depth
    // segments ahead would make the arbiter retarget the slot that already holds the next one.
    if (residency_) prefetch_after(seg, prev_held ? depth - 1 : depth);
    const layer_weights L = bind_layer(plan.layers[static_cast<size_t>(l)], last_base);

    cu::rms_norm(d.x, L.attn_norm, d.xb, n, D, c.rms_eps, s);
    mats(d.xb, n, {{&L.wq, d.q}, {&L.wk, d.k}, {&L.wv, d.v}});
    if (L.bq) cu::add_rows(d.q, L.bq, n, Q, s);
    if (L.bk) cu::add_rows(d.k, L.bk, n, KV, s);
    if (L.bv) cu::add_rows(d.v, L.bv, n, KV, s);
    if (L.q_norm) {
      cu::rms_norm(d.q, L.q_norm, d.q, n * c.n_head, hd, c.rms_eps, s);
      cu::rms_norm(d.k, L.k_norm, d.k, n * c.n_head_kv, hd, c.rms_eps, s);
    }
    const float* ff = d.freq_factors.as<float>();
    cu::rope(d.q, n, Q, static_cast<int>(c.n_head), static_cast<int>(hd), rows.pos, rope_, ff, s);
    cu::rope(d.k, n, KV, static_cast<int>(c.n_head_kv), static_cast<int>(hd), rows.pos, rope_, ff, s);

    std::byte* kv_base = kv_pool_ ? kv_pool_->data() : d.kv.as<std::byte>();
    const size_t eb = elem_bytes(kv_);
    const cu::paged_layer layer{kv_base + (2 * static_cast<size_t>(l)) * d.part_bytes,
                                kv_base + (2 * static_cast<size_t>(l) + 1) * d.part_bytes,
                                kv_,
                                block_tokens_,
                                static_cast<int64_t>(d.block_bytes / eb),
                                KV};
    cu::kv_store(layer, d.k, d.v, n, rows, s);
    cu::attention(d.q, d.attn, n, rows, layer, static_cast<int>(c.n_head), static_cast<int>(c.n_head_kv), static_cast<int>(hd), attn_scale,
                  s);
    mat(L.wo, d.attn, n, d.xb);
    cu::add(d.x, d.xb, n * D, s);

    cu::rms_norm(d.x, L.ffn_norm, d.xb, n, D, c.rms_eps, s);
    mats(d.xb, n, {{&L.w_gate, d.gate}, {&L.w_up, d.up}});
    cu::swiglu(d.gate, d.up, n * F, s);
    mat(L.w_down, d.gate, n, d.xb);
    cu::add(d.x, d.xb, n * D, s);
    if (overlap) {
      d.layer_done[l % 2].record(s);
      if (prev_held) {
        prev_held.end_after(d.layer_done[(l + 1) % 2]);  // layer l-1's event
        prefetch_after(seg, depth);  // into the slot just freed
      }
    }
    // Another model's passes may run here: its kernels queue on its own stream behind nothing
    // of this pass but the layer already queued. Leased weights only, so never inside a
    // graph capture (graphs are for passes over weights of their own).
    if (residency_ && between_layers_ && l + 1 < c.n_layer) between_layers_();
  }

  const float* out_norm = bind_vector_at(plan.output_norm, layer_held.base);
  for (int64_t k = 0; k < n_out; ++k) cu::rms_norm(d.x + out_rows[k] * D, out_norm, d.xb + k * D, 1, D, c.rms_eps, s);
  layer_held = lease();
  if (n_out == 0) return;

  for (size_t i = 0; i < plan.output.size(); ++i) {
    const auto& piece = plan.output[i];
    const lease held(*this, piece.segment);
    const weight_view head = bind_matrix_at(piece.m, held.base);
    if (residency_)
      for (int k = 1; k <= depth && i + static_cast<size_t>(k) < plan.output.size(); ++k)
        residency_->prefetch(plan.output[i + static_cast<size_t>(k)].segment);
    if (plan.output.size() == 1) {
      mat(head, d.xb, n_out, d.logits.as<float>());
    } else {
      const int64_t pr = head.rows;
      mat(head, d.xb, n_out, d.head.as<float>());
      for (int64_t k = 0; k < n_out; ++k)
        cu::copy_on_device(d.logits.as<float>() + k * n_vocab_ + piece.row0, d.head.as<float>() + k * pr,
                           static_cast<size_t>(pr) * sizeof(float), s);
    }
  }
}

}  // namespace tandem::models
