#include "models/forward.h"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <stdexcept>
#include <string>

#include "memory/memory_limits.h"
#include "models/cpu_pass.h"
#include "models/recipe_runner.h"

namespace tandem::models {
namespace {

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

// Bytes of n_ctx positions of one layer's K (or V).
size_t kv_part_bytes(const model_config& c, int64_t n_ctx, kernels::cpu::kv_type t) {
  return static_cast<size_t>(kernels::cpu::kv_bytes(t, n_ctx * c.kv_dim()));
}

// Every allocation a context makes at construction, computed before any of it is made.
struct context_sizes {
  int64_t n_ctx = 0;
  int64_t n_seq = 1;
  int64_t rows = 0;  // scratch rows: max_batch clamped to [1, n_ctx], at least n_seq
  uint64_t kv = 0, scratch = 0, logits = 0;
  bool own_scratch = true;  // false: the caller provides it (context_params::scratch)
  uint64_t total() const { return kv + (own_scratch ? scratch : 0) + logits; }
};

int64_t resolve_n_ctx(const model_config& c, const context_params& p) {
  return p.n_ctx != 0 ? p.n_ctx : std::min(c.n_ctx_train, k_default_context);  // negative: refused by the caller
}

context_sizes size_context(const model_config& c, const context_params& p) {
  context_sizes s;
  s.n_ctx = resolve_n_ctx(c, p);
  if (s.n_ctx < 1 || s.n_ctx > k_max_context)
    throw std::invalid_argument("context size " + std::to_string(s.n_ctx) + " is outside [1, " + std::to_string(k_max_context) + "]");
  if (p.n_seq < 1 || p.n_seq > k_max_sequences)
    throw std::invalid_argument("sequence count " + std::to_string(p.n_seq) + " is outside [1, " + std::to_string(k_max_sequences) + "]");
  s.n_seq = p.n_seq;
  s.rows = std::max(std::clamp<int64_t>(p.max_batch, 1, s.n_ctx), s.n_seq);
  // n_seq <= 2^8 and one sequence's cache < 2^56 bytes (kv_cache_bytes): products below are
  // checked against that before multiplying.
  const uint64_t one = kv_cache_bytes(c, s.n_ctx, p.kv);
  if (one > (UINT64_MAX >> 9)) throw std::invalid_argument("a KV cache of " + std::to_string(s.n_ctx) + " positions is too large");
  s.kv = p.kv_pool ? 0 : one * static_cast<uint64_t>(s.n_seq);
  // Per row: x and xb [n_embd], q and attn [q_dim], k and v [kv_dim], ff_gate and ff_up [n_ff],
  // RoPE's cos/sin [head_dim at most]. The config caps (q_dim <= 2^17, n_ff <= 2^18) and
  // rows <= 2^24 keep this far from overflow.
  const auto per_row = static_cast<uint64_t>(2 * (c.n_embd + c.q_dim() + c.kv_dim() + c.n_ff) + c.head_dim);
  s.scratch = static_cast<uint64_t>(s.rows) * per_row * sizeof(float);
  s.own_scratch = p.scratch == nullptr;
  s.logits = static_cast<uint64_t>(c.n_vocab) * static_cast<uint64_t>(s.n_seq) * sizeof(float);
  return s;
}

std::string mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

}  // namespace

// The rows' pointers are the caller's (begin, eval, decode), valid until the pass is over.
struct forward_context::in_flight {
  std::optional<cpu_pass> pass;
  std::optional<whole_pass_hold> whole;
  std::optional<layer_walk> walk;
  const int64_t* seqs = nullptr;
  const int64_t* positions = nullptr;
  int64_t n = 0;
  // The walk first (it may lease from the hold's residency), the backend last.
  void clear() {
    walk.reset();
    whole.reset();
    pass.reset();
  }
};

kernels::cpu::rope_params rope_params_of(const model_config& c, const model_weights& w) { return make_rope(c, w); }

uint64_t kv_cache_bytes(const model_config& c, int64_t n_ctx, kernels::cpu::kv_type kv) {
  // K and V, every layer; n_ctx <= 2^24, kv_dim <= q_dim <= 2^17 and n_layer <= 1024 keep this
  // below 2^56.
  return 2ull * static_cast<uint64_t>(c.n_layer) * static_cast<uint64_t>(n_ctx) * static_cast<uint64_t>(kernels::cpu::kv_bytes(kv, c.kv_dim()));
}

uint64_t kv_bytes_per_token(const model_config& c, kernels::cpu::kv_type kv) { return kv_cache_bytes(c, 1, kv); }

std::string kv_type_problem(const model_config& c, kernels::cpu::kv_type kv, bool rotate) {
  const std::string heads = " (the model's heads are " + std::to_string(c.head_dim) + " wide)";
  if (kernels::cpu::kv_quantized(kv) && c.head_dim % kernels::cpu::k_kv_quant_block != 0)
    return std::string("a ") + kernels::cpu::kv_type_name(kv) + " KV cache needs heads of a multiple of 32 elements" + heads;
  if (rotate && (c.head_dim <= 0 || (c.head_dim & (c.head_dim - 1)) != 0)) return "a rotated KV cache needs heads of a power-of-two width" + heads;
  return {};
}

uint64_t forward_context::memory_bytes(const model_config& c, const context_params& p) { return size_context(c, p).total(); }
uint64_t forward_context::scratch_bytes(const model_config& c, const context_params& p) { return size_context(c, p).scratch; }

forward_context::forward_context(const model& m, const context_params& p, kernels::cpu::thread_pool* pool, weight_residency* residency)
    : model_(m),
      pool_(pool),
      residency_(residency),
      kv_type_(p.kv),
      kv_rotate_(p.kv_rotate),
      rope_(make_rope(m.config(), m.weights())),
      n_vocab_(m.config().n_vocab),
      flight_(std::make_unique<in_flight>()) {
  const auto& c = m.config();
  if (const std::string why = kv_type_problem(c, p.kv, p.kv_rotate); !why.empty()) throw std::invalid_argument(why);
  const auto sizes = size_context(c, p);
  n_ctx_ = sizes.n_ctx;
  max_batch_ = sizes.rows;
  // The sizes follow file metadata (widths, the training context), so a file could ask for
  // far more than the process can get: refuse that with a message instead of bad_alloc or the
  // OOM killer.
  if (const uint64_t usable = memory::usable_memory_bytes(memory::read_memory_limits()); usable > 0 && sizes.total() > usable)
    throw std::runtime_error("a context of " + std::to_string(sizes.n_seq) + " x " + std::to_string(n_ctx_) + " tokens needs " + mib(sizes.total()) +
                             " (KV cache " + mib(sizes.kv) + ", scratch for " + std::to_string(sizes.rows) + " rows " + mib(sizes.scratch) +
                             ", logits " + mib(sizes.logits) + "), more than the " + mib(usable) +
                             " of memory this process can get; use a smaller context size");
  kv_layer_bytes_ = kv_part_bytes(c, n_ctx_, kv_type_);
  n_layer_ = c.n_layer;
  pos_.assign(static_cast<size_t>(sizes.n_seq), 0);
  prompt_end_.assign(static_cast<size_t>(sizes.n_seq), 0);
  // Private copies of a team member's activations (cpu_pass.cpp), for decode steps run as
  // layer teams.
  if (p.layer_teams && pool && pool->size() > 1) {
    team_scratch_floats_ = static_cast<size_t>(k_team_max_rows * 2 * (c.n_embd + c.q_dim() + c.kv_dim() + c.n_ff));
    team_scratch_.resize(team_scratch_floats_ * static_cast<size_t>(pool->size()));
  }
  row_seq_.resize(static_cast<size_t>(max_batch_));
  runs_.reserve(static_cast<size_t>(max_batch_));  // at most one run per row: no allocation per step
  run_start_.reserve(static_cast<size_t>(max_batch_) + 1);
  step_out_.reserve(static_cast<size_t>(max_batch_));
  row_pos_.resize(static_cast<size_t>(max_batch_));
  if (p.kv_pool) {
    kv_pool_ = p.kv_pool;
    const uint64_t want = kv_bytes_per_token(c, kv_type_) * static_cast<uint64_t>(kv_pool_->block_tokens());
    if (kv_pool_->block_bytes() != want)
      throw std::invalid_argument("KV pool blocks are " + std::to_string(kv_pool_->block_bytes()) + " bytes; this model needs " +
                                  std::to_string(want) + " for " + std::to_string(kv_pool_->block_tokens()) + " positions");
    paged_part_bytes_ = kv_part_bytes(c, kv_pool_->block_tokens(), kv_type_);
    paged_block_stride_ = static_cast<int64_t>(kv_pool_->block_stride());
  } else {
    // Uninitialised: the OS commits pages as they are written. Huge pages, because decode
    // reads a layer's whole cache at every token after the weights have pushed it out of every
    // cache level, and on 4 KiB pages its key blocks missed the TLB as well (perf put attention
    // at 40% of a 1,500-token generation; 1,000 tokens of SmolLM2 went from 248-256 to 294-302
    // tok/s).
    kv_ = memory::huge_buffer(sizes.kv);
  }
  // Scratch: one uninitialised block carved up like the cache, so a context sized for long
  // prompts commits only the rows its prompts use. Every row is written before it is read.
  float* next = nullptr;
  if (p.scratch) {
    next = reinterpret_cast<float*>(p.scratch);
  } else {
    scratch_.reset(new float[sizes.scratch / sizeof(float)]);
    next = scratch_.get();
  }
  auto carve = [&](int64_t per_row) {
    float* p = next;
    next += static_cast<size_t>(max_batch_ * per_row);
    return p;
  };
  x_ = carve(c.n_embd);
  // xb_ holds normed inputs and the outputs of wo, w_down and the norm before the output head:
  // n_embd per row in every case (wo maps q_dim back to n_embd).
  xb_ = carve(c.n_embd);
  q_ = carve(c.q_dim());
  k_ = carve(c.kv_dim());
  v_ = carve(c.kv_dim());
  attn_ = carve(c.q_dim());
  ff_gate_ = carve(c.n_ff);
  ff_up_ = carve(c.n_ff);
  rope_cs_ = carve(c.head_dim);
  logits_.resize(static_cast<size_t>(n_vocab_ * sizes.n_seq));
}

forward_context::~forward_context() = default;

void forward_context::check_seq(int64_t seq) const {
  if (seq < 0 || seq >= n_seq()) throw std::invalid_argument("sequence " + std::to_string(seq) + " is outside [0, " + std::to_string(n_seq()) + ")");
}

void forward_context::reset(int64_t seq) {
  check_seq(seq);
  pos_[static_cast<size_t>(seq)] = 0;
  prompt_end_[static_cast<size_t>(seq)] = 0;
}

void forward_context::set_prompt_end(int64_t seq, int64_t end) {
  check_seq(seq);
  prompt_end_[static_cast<size_t>(seq)] = std::max<int64_t>(end, 0);
}

void forward_context::truncate(int64_t pos, int64_t seq) {
  check_seq(seq);
  int64_t& p = pos_[static_cast<size_t>(seq)];
  if (pos < 0 || pos > p) throw std::invalid_argument("truncate: position " + std::to_string(pos) + " is outside [0, " + std::to_string(p) + "]");
  p = pos;
}

void forward_context::assume(int64_t pos, int64_t seq) {
  check_seq(seq);
  check_assume(pos, seq, pos_[static_cast<size_t>(seq)], n_ctx_, kv_pool_ ? kv_pool_->capacity(seq) : -1);
  pos_[static_cast<size_t>(seq)] = pos;
}

void forward_context::eval(std::span<const int32_t> tokens, bool all_logits, int64_t seq) {
  if (tokens.empty()) return;
  check_seq(seq);
  for (const int32_t t : tokens)
    if (t < 0 || t >= n_vocab_)
      throw std::invalid_argument("token id " + std::to_string(t) + " is outside the vocabulary (" + std::to_string(n_vocab_) + ")");
  const int64_t pos0 = pos_[static_cast<size_t>(seq)];
  if (pos0 + static_cast<int64_t>(tokens.size()) > n_ctx_)
    throw std::invalid_argument("context overflow: " + std::to_string(pos0) + " + " + std::to_string(tokens.size()) +
                                " tokens exceed the context size " + std::to_string(n_ctx_));
  const auto n = static_cast<int64_t>(tokens.size());
  check_capacity(seq, pos0 + n);
  if (all_logits && logits_.size() < static_cast<size_t>(n * n_vocab_)) logits_.resize(static_cast<size_t>(n * n_vocab_));
  n_logit_rows_ = all_logits ? n : 1;
  for (int64_t done = 0; done < n; done += max_batch_) {
    const int64_t chunk = std::min(max_batch_, n - done);
    for (int64_t r = 0; r < chunk; ++r) {
      row_seq_[static_cast<size_t>(r)] = seq;
      row_pos_[static_cast<size_t>(r)] = pos0 + done + r;
    }
    // Without all_logits only the very last token's logits are kept, so earlier chunks skip
    // the output head (an n_vocab x n_embd matmul per chunk).
    const bool last = done + chunk == n;
    float* out = all_logits ? logits_.data() + done * n_vocab_ : last ? logits_.data() : nullptr;
    const int64_t last_row = chunk - 1;
    eval_chunk(tokens.data() + done, row_seq_.data(), row_pos_.data(), chunk, out, all_logits ? nullptr : &last_row, 1);
  }
}

void forward_context::decode(std::span<const int32_t> tokens, std::span<const int64_t> seqs) {
  if (tokens.size() != seqs.size())
    throw std::invalid_argument("decode: " + std::to_string(tokens.size()) + " tokens for " + std::to_string(seqs.size()) + " sequences");
  if (tokens.empty()) return;
  const auto n = static_cast<int64_t>(tokens.size());
  if (n > n_seq()) throw std::invalid_argument("decode: " + std::to_string(n) + " rows for " + std::to_string(n_seq()) + " sequences");
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = seqs[static_cast<size_t>(i)];
    check_seq(s);
    for (int64_t j = 0; j < i; ++j)
      if (seqs[static_cast<size_t>(j)] == s) throw std::invalid_argument("decode: sequence " + std::to_string(s) + " is listed twice");
    const int32_t t = tokens[static_cast<size_t>(i)];
    if (t < 0 || t >= n_vocab_)
      throw std::invalid_argument("token id " + std::to_string(t) + " is outside the vocabulary (" + std::to_string(n_vocab_) + ")");
    if (pos_[static_cast<size_t>(s)] >= n_ctx_)
      throw std::invalid_argument("context overflow: sequence " + std::to_string(s) + " is full (" + std::to_string(n_ctx_) + " tokens)");
    check_capacity(s, pos_[static_cast<size_t>(s)] + 1);
  }
  // n <= n_seq <= max_batch_: one chunk.
  for (int64_t i = 0; i < n; ++i) {
    row_seq_[static_cast<size_t>(i)] = seqs[static_cast<size_t>(i)];
    row_pos_[static_cast<size_t>(i)] = pos_[static_cast<size_t>(seqs[static_cast<size_t>(i)])];
  }
  n_logit_rows_ = n;
  eval_chunk(tokens.data(), row_seq_.data(), row_pos_.data(), n, logits_.data(), nullptr, n);
}

void forward_context::begin(std::span<const int32_t> tokens, std::span<const int64_t> seqs, std::span<const int64_t> logit_rows) {
  flight_->clear();
  if (tokens.empty() && seqs.empty()) return;
  lay_out_step(
      tokens, seqs, logit_rows, n_vocab_, max_batch_, max_batch_,
      [this](int64_t s) {
        check_seq(s);
        return pos_[static_cast<size_t>(s)];
      },
      [this](int64_t s, int64_t need) {
        if (need > n_ctx_)
          throw std::invalid_argument("context overflow: sequence " + std::to_string(s) + " would hold " + std::to_string(need) + " of " +
                                      std::to_string(n_ctx_) + " positions");
        check_capacity(s, need);
      },
      step_out_, row_pos_.data());
  const auto n = static_cast<int64_t>(tokens.size());
  for (int64_t i = 0; i < n; ++i) row_seq_[static_cast<size_t>(i)] = seqs[static_cast<size_t>(i)];
  const auto runs = static_cast<int64_t>(step_out_.size());
  if (logits_.size() < static_cast<size_t>(runs * n_vocab_)) logits_.resize(static_cast<size_t>(runs * n_vocab_));
  n_logit_rows_ = runs;
  begin_chunk(tokens.data(), row_seq_.data(), row_pos_.data(), n, logits_.data(), step_out_.data(), runs);
}

void forward_context::eval_chunk(const int32_t* tokens, const int64_t* seqs, const int64_t* positions, int64_t n, float* logits,
                                 const int64_t* out_rows, int64_t n_out) {
  begin_chunk(tokens, seqs, positions, n, logits, out_rows, n_out);
  while (!advance()) {
  }
}

void forward_context::begin_chunk(const int32_t* tokens, const int64_t* seqs, const int64_t* positions, int64_t n, float* logits,
                                  const int64_t* out_rows, int64_t n_out) {
  const auto& c = model_.config();
  const int64_t hd = c.head_dim;
  // RoPE's cos/sin of each row's position, once for every layer's q and k.
  for (int64_t r = 0; r < n; ++r) kernels::cpu::rope_table(positions[r], static_cast<int>(hd), rope_, rope_cs_ + r * hd);
  // Attention runs: consecutive rows of one sequence (the whole chunk for a prompt, one row per
  // sequence in a batched decode), the same in every layer. run_start_ holds each run's first
  // row and n after the last; both vectors were reserved for max_batch_ rows.
  run_start_.clear();
  for (int64_t r = 0; r < n; ++r)
    if (r == 0 || seqs[r] != seqs[r - 1]) run_start_.push_back(r);
  runs_.resize(run_start_.size());
  run_start_.push_back(n);
  in_flight& f = *flight_;
  f.clear();
  cpu_pass& pass = f.pass.emplace(*this, tokens, seqs, positions, n, logits, out_rows, n_out, false);
  // Decode steps (up to k_team_max_rows rows, all of one arithmetic) run each layer as one
  // team job (context_params::layer_teams).
  pass.team = !team_scratch_.empty() && n <= k_team_max_rows;
  for (int64_t r = 1; r < n && pass.team; ++r) pass.team = pass.fast(r) == pass.fast(0);
  f.whole.emplace(residency_);  // all on the device: no per-layer lease
  try {
    run_embedding(pass, model_, residency_, {tokens, static_cast<size_t>(n)});
    f.walk.emplace(recipe_for(c), pass, model_, residency_, logits != nullptr);
  } catch (...) {
    f.clear();
    throw;
  }
  f.seqs = seqs;
  f.positions = positions;
  f.n = n;
}

bool forward_context::advance() {
  in_flight& f = *flight_;
  if (!f.walk) return true;  // nothing begun (an empty step)
  try {
    if (!f.walk->advance()) return false;
  } catch (...) {
    f.clear();
    throw;
  }
  // Positions move only once the pass has run: a failure leaves the sequences where they were.
  for (int64_t r = 0; r < f.n; ++r) pos_[static_cast<size_t>(f.seqs[r])] = f.positions[r] + 1;
  f.clear();
  return true;
}

void forward_context::paged_store(int64_t s, int64_t layer, int64_t p0, const float* k, const float* v, int64_t len) {
  const auto& table = kv_pool_->table(s);
  const int64_t bt = kv_pool_->block_tokens(), KV = model_.config().kv_dim();
  for (int64_t done = 0; done < len;) {
    const int64_t p = p0 + done;
    const int64_t in_block = std::min(len - done, bt - p % bt);
    std::byte* block = kv_pool_->data() + static_cast<size_t>(table[static_cast<size_t>(p / bt)]) * kv_pool_->block_stride();
    kernels::cpu::kv_store(block + paged_offset(layer, 0), kv_type_, p % bt, k + done * KV, in_block, KV);
    kernels::cpu::kv_store(block + paged_offset(layer, 1), kv_type_, p % bt, v + done * KV, in_block, KV);
    done += in_block;
  }
}

void forward_context::check_capacity(int64_t seq, int64_t end) const {
  if (!kv_pool_ || kv_pool_->capacity(seq) >= end) return;
  throw std::invalid_argument("sequence " + std::to_string(seq) + " needs KV blocks for " + std::to_string(end) + " positions but holds " +
                              std::to_string(kv_pool_->capacity(seq)) + (kv_pool_->swapped_out(seq) ? " (swapped out)" : "") +
                              "; reserve them in the KV pool first");
}

}  // namespace tandem::models
