#include "models/cpu_pass.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"

namespace tandem::models {
namespace {

namespace kc = kernels::cpu;
using kc::sum_order;

sum_order order_for(bool fast) { return fast ? sum_order::tile : sum_order::ggml; }
kc::swiglu_exp exp_for(bool fast) { return fast ? kc::swiglu_exp::vector : kc::swiglu_exp::expf; }

kc::matmul_job job(const weight_view& w, float* y, bool fast) { return {w.type, w.data, w.rows, y, w.layout, order_for(fast)}; }

// Calls fn(r0, r1, fast) for each run [r0, r1) of consecutive rows with the same fast(r): the
// rows of the server's arithmetic and the others go through separate calls, so no row's
// arithmetic depends on what shares its pass. One run, one call, in the usual case.
template <class Fast, class Fn>
void by_arithmetic(int64_t n, Fast&& fast, Fn&& fn) {
  for (int64_t r0 = 0; r0 < n;) {
    int64_t r1 = r0 + 1;
    while (r1 < n && fast(r1) == fast(r0)) ++r1;
    fn(r0, r1, fast(r0));
    r0 = r1;
  }
}

void rope_rows(const cpu_pass& p, float* a, int64_t width, int64_t n_heads, int64_t r0, int64_t r1) {
  const int64_t hd = p.c.head_dim;
  for (int64_t r = r0; r < r1; ++r) kc::rope_apply(a + r * width, static_cast<int>(n_heads), static_cast<int>(hd), p.rope_cs + r * hd, p.rope);
}

void head_norm_rows(const cpu_pass& p, float* a, int64_t width, const float* w, int64_t n_heads, int64_t r0, int64_t r1) {
  const auto& c = p.c;
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t h = 0; h < n_heads; ++h) kc::rms_norm(a + r * width + h * c.head_dim, w, a + r * width + h * c.head_dim, c.head_dim, c.rms_eps);
}

void bias_rows(float* a, int64_t width, const float* b, int64_t r0, int64_t r1) {
  for (int64_t r = r0; r < r1; ++r)
    for (int64_t i = 0; i < width; ++i) a[r * width + i] += b[i];
}

// A layer by steps: each op over every row, its products split over the pool.
class step_ops final : public layer_ops {
 public:
  explicit step_ops(cpu_pass& p) : p_(p) {}

  void norm(act in, const float* w, act out) override {
    const auto& c = p_.c;
    const int64_t W = p_.width(in);
    float *x = p_.buf(in), *y = p_.buf(out);
    for (int64_t r = 0; r < p_.n; ++r) kc::rms_norm(x + r * W, w, y + r * W, W, c.rms_eps);
  }
  void matmul(act in, std::initializer_list<product> products) override {
    const float* x = p_.buf(in);
    const int64_t cols = products.begin()->w->cols;
    by_arithmetic(p_.n, fast(), [&](int64_t r0, int64_t r1, bool f) {
      if (products.size() == 1) {
        const weight_view& w = *products.begin()->w;
        kc::matmul(w.type, w.data, w.rows, w.cols, x + r0 * cols, r1 - r0, p_.buf(products.begin()->out) + r0 * w.rows, p_.pool, w.layout,
                   order_for(f));
        return;
      }
      std::array<kc::matmul_job, kc::k_max_matmul_jobs> jobs{};
      int k = 0;
      for (const product& pr : products) jobs[static_cast<size_t>(k++)] = job(*pr.w, p_.buf(pr.out) + r0 * pr.w->rows, f);
      kc::matmul_many(jobs.data(), k, cols, x + r0 * cols, r1 - r0, p_.pool);
    });
  }
  void matmul_swiglu(act in, const weight_view& wg, const weight_view& wu, act gate, act up) override {
    const float* x = p_.buf(in);
    by_arithmetic(p_.n, fast(), [&](int64_t r0, int64_t r1, bool f) {
      kc::matmul_swiglu(job(wg, p_.buf(gate) + r0 * wg.rows, f), job(wu, p_.buf(up) + r0 * wu.rows, f), wg.cols, x + r0 * wg.cols, r1 - r0, p_.pool,
                        exp_for(f));
    });
  }
  void add_bias(act a, const float* b) override { bias_rows(p_.buf(a), p_.width(a), b, 0, p_.n); }
  void head_norm(act a, const float* w, int64_t n_heads) override { head_norm_rows(p_, p_.buf(a), p_.width(a), w, n_heads, 0, p_.n); }
  void rope(act a, int64_t n_heads) override { rope_rows(p_, p_.buf(a), p_.width(a), n_heads, 0, p_.n); }
  void kv_store(int64_t layer, act k, act v) override { p_.store_runs(layer, 0, runs(), p_.buf(k), p_.buf(v)); }
  void attention(int64_t layer, act q, act out) override {
    const auto& c = p_.c;
    p_.rotate_rows(p_.buf(q), p_.width(q), c.n_head, 0, p_.n);
    p_.set_runs(layer, 0, runs(), p_.buf(q), p_.buf(out));
    kc::attention_many(p_.runs.data(), runs(), p_.kv, static_cast<int>(c.n_head), static_cast<int>(c.n_head_kv), static_cast<int>(c.head_dim),
                       1.0f / std::sqrt(static_cast<float>(c.head_dim)), p_.pool);
    p_.rotate_rows(p_.buf(out), p_.width(out), c.n_head, 0, p_.n);
  }
  void add(act dst, act src) override {
    float* y = p_.buf(dst);
    const float* x = p_.buf(src);
    for (int64_t i = 0, e = p_.n * p_.width(dst); i < e; ++i) y[i] += x[i];
  }

 private:
  struct fast_of {
    const cpu_pass& p;
    bool operator()(int64_t r) const { return p.fast(r); }
  };
  fast_of fast() const { return {p_}; }
  int64_t runs() const { return static_cast<int64_t>(p_.runs.size()); }
  cpu_pass& p_;
};

// One member's view of a layer run as a team. Each activation is tracked in the state the
// member's previous ops left it in, the same on every member (the ops are the same and so are
// the decisions): whole (every member's writes visible), private (a full copy of the member's
// own), or written in parts since the last barrier (by output columns, by runs, other). An op
// that reads what other members wrote syncs first; writing a shared buffer that the others
// may still be reading in this barrier interval syncs first too.
class team_ops final : public layer_ops {
 public:
  team_ops(cpu_pass& p, int member, kc::team& t, float* own) : p_(p), member_(member), t_(t), part_{member, t.members()}, own_(own) {
    // This member's runs: those whose first row falls in its share of the rows.
    const auto& starts = p.run_start;
    auto first_run_from = [&](int64_t row) { return static_cast<int64_t>(std::lower_bound(starts.begin(), starts.end() - 1, row) - starts.begin()); };
    const int64_t m = member, count = t.members(), n = p.n;
    run0_ = first_run_from((m * n + count - 1) / count);
    run1_ = first_run_from(((m + 1) * n + count - 1) / count);
    last_read_.fill(-1);
  }

  void norm(act in, const float* w, act out) override {
    const auto& c = p_.c;
    const float* x = read_whole(in);
    float* y = own(out);
    const int64_t W = p_.width(in);
    for (int64_t r = 0; r < p_.n; ++r) kc::rms_norm(x + r * W, w, y + r * W, W, c.rms_eps);
    state_[idx(out)] = {kind::own};
  }
  void matmul(act in, std::initializer_list<product> products) override {
    const float* x = read_whole(in);
    std::array<kc::matmul_job, kc::k_max_matmul_jobs> jobs{};
    int k = 0;
    for (const product& pr : products) jobs[static_cast<size_t>(k++)] = job(*pr.w, write_shared(pr.out), fast0());
    const kc::row_span rows = kc::matmul_many_part(jobs.data(), k, products.begin()->w->cols, x, p_.n, part_);
    for (const product& pr : products) state_[idx(pr.out)] = products.size() == 1 ? slot{kind::cols, rows} : slot{kind::parts};
  }
  void matmul_swiglu(act in, const weight_view& wg, const weight_view& wu, act gate, act up) override {
    const float* x = read_whole(in);
    float* yg = write_shared(gate);
    float* yu = write_shared(up);
    const kc::row_span rows = kc::matmul_swiglu_part(job(wg, yg, fast0()), job(wu, yu, fast0()), wg.cols, x, p_.n, part_, exp_for(fast0()));
    state_[idx(gate)] = state_[idx(up)] = {kind::cols, rows};
  }
  void add_bias(act a, const float* b) override {
    float* y = runs_of(a);
    for (int64_t i = run0_; i < run1_; ++i) bias_rows(y, p_.width(a), b, row0(i), row0(i + 1));
  }
  void head_norm(act a, const float* w, int64_t n_heads) override {
    float* y = runs_of(a);
    head_norm_rows(p_, y, p_.width(a), w, n_heads, row0(run0_), row0(run1_));
  }
  void rope(act a, int64_t n_heads) override {
    float* y = runs_of(a);
    rope_rows(p_, y, p_.width(a), n_heads, row0(run0_), row0(run1_));
  }
  void kv_store(int64_t layer, act k, act v) override {
    float* yk = runs_of(k);
    float* yv = runs_of(v);
    p_.store_runs(layer, run0_, run1_, yk, yv);
  }
  void attention(int64_t layer, act q, act out) override {
    const auto& c = p_.c;
    // Each member lays out its own runs; after one barrier every member sees every run, the
    // KV rows the others stored and their rows of q.
    float* yq = runs_of(q);
    p_.rotate_rows(yq, p_.width(q), c.n_head, row0(run0_), row0(run1_));
    float* y = write_shared(out);
    p_.set_runs(layer, run0_, run1_, yq, y);
    t_.sync(member_);
    ++epoch_;
    settle();
    kc::attention_many_part(p_.runs.data(), static_cast<int64_t>(p_.runs.size()), p_.kv, static_cast<int>(c.n_head), static_cast<int>(c.n_head_kv),
                            static_cast<int>(c.head_dim), 1.0f / std::sqrt(static_cast<float>(c.head_dim)), part_);
    state_[idx(out)] = {kind::parts};
    if (p_.rotate) {
      // The output rotates back row by row, so each member takes its runs' rows once all parts are in.
      float* yo = runs_of(out);
      p_.rotate_rows(yo, p_.width(out), c.n_head, row0(run0_), row0(run1_));
    }
  }
  void add(act dst, act src) override {
    const int64_t W = p_.width(dst);
    const slot s = state_[idx(src)];
    if (s.k == kind::cols) {
      // The columns this member wrote are the columns it adds: no barrier, and dst in shared
      // memory afterwards holds them (the others write theirs).
      const slot d = state_[idx(dst)];
      sync_if(partial(d) && !(d.k == kind::cols && d.rows.begin == s.rows.begin && d.rows.end == s.rows.end));
      const float* cur = view(dst);
      float* y = write_shared(dst);
      const float* x = p_.buf(src);
      for (int64_t r = 0; r < p_.n; ++r)
        for (int64_t i = s.rows.begin; i < s.rows.end; ++i) y[r * W + i] = cur[r * W + i] + x[r * W + i];
      state_[idx(dst)] = s;
      return;
    }
    const float* x = read_whole(src);
    const float* cur = read_whole(dst);
    float* y = own(dst);
    for (int64_t i = 0, e = p_.n * W; i < e; ++i) y[i] = cur[i] + x[i];
    state_[idx(dst)] = {kind::own};
  }

 private:
  enum class kind : uint8_t { whole, own, cols, runs, parts };
  struct slot {
    kind k = kind::whole;
    kc::row_span rows{};  // kind::cols: the output columns this member wrote
  };
  static size_t idx(act a) { return static_cast<size_t>(a); }
  static bool partial(const slot& s) { return s.k == kind::cols || s.k == kind::runs || s.k == kind::parts; }
  bool fast0() const { return p_.fast(0); }
  int64_t row0(int64_t run) const { return p_.run_start[static_cast<size_t>(run)]; }

  // Every member's writes so far are visible after a barrier.
  void settle() {
    for (slot& s : state_)
      if (partial(s)) s = {kind::whole};
  }
  void sync_if(bool need) {
    if (!need) return;
    t_.sync(member_);
    ++epoch_;
    settle();
  }
  float* own(act a) const { return own_ + offset(a); }
  // The member's current contents of a (its private copy, or the shared buffer).
  const float* view(act a) const { return state_[idx(a)].k == kind::own ? own(a) : p_.buf(a); }
  // a, every row and column of it: a barrier first if others wrote parts of it.
  const float* read_whole(act a) {
    sync_if(partial(state_[idx(a)]));
    if (state_[idx(a)].k != kind::own) last_read_[idx(a)] = epoch_;
    return view(a);
  }
  // The shared buffer of a, to write a part of: a barrier first if others may be reading it.
  float* write_shared(act a) {
    sync_if(last_read_[idx(a)] == epoch_);
    return p_.buf(a);
  }
  // The rows of this member's runs of a, in shared memory, to read and write.
  float* runs_of(act a) {
    const slot s = state_[idx(a)];
    sync_if(s.k == kind::cols || s.k == kind::parts);
    if (state_[idx(a)].k == kind::own) {
      // A private copy goes to shared memory first (the others read the rows of their runs).
      const int64_t W = p_.width(a);
      float* y = write_shared(a);
      std::copy(own(a) + row0(run0_) * W, own(a) + row0(run1_) * W, y + row0(run0_) * W);
    } else {
      sync_if(last_read_[idx(a)] == epoch_);
    }
    state_[idx(a)] = {kind::runs};
    return p_.buf(a);
  }
  size_t offset(act a) const {
    size_t at = 0;
    for (int i = 0; i < static_cast<int>(a); ++i) at += static_cast<size_t>(p_.width(static_cast<act>(i)) * p_.n);
    return at;
  }

  cpu_pass& p_;
  int member_;
  kc::team& t_;
  kc::team_part part_;
  float* own_;  // private copies of every activation, n rows each, in act order
  int64_t run0_ = 0, run1_ = 0;
  int64_t epoch_ = 0;  // barriers passed in this layer
  std::array<slot, k_act_count> state_{};
  std::array<int64_t, k_act_count> last_read_{};  // epoch of the last read of the shared buffer
};

}  // namespace

cpu_pass::cpu_pass(forward_context& f, const int32_t* tokens, const int64_t* seqs, const int64_t* positions, int64_t n, float* logits,
                   const int64_t* out_rows, int64_t n_out, bool team)
    : f(f),
      c(f.model_.config()),
      pool(f.pool_),
      kv(f.kv_type_),
      rotate(f.kv_rotate_),
      rope(f.rope_),
      rope_cs(f.rope_cs_),
      runs(f.runs_),
      run_start(f.run_start_),
      prompt_end(f.prompt_end_),
      team_scratch(f.team_scratch_.empty() ? nullptr : f.team_scratch_.data()),
      team_scratch_floats(f.team_scratch_floats_),
      tokens(tokens),
      seqs(seqs),
      positions(positions),
      n(n),
      logits(logits),
      out_rows(out_rows),
      n_out(n_out),
      team(team) {}

float* cpu_pass::buf(act a) const {
  switch (a) {
    case act::x:
      return f.x_;
    case act::xb:
      return f.xb_;
    case act::q:
      return f.q_;
    case act::k:
      return f.k_;
    case act::v:
      return f.v_;
    case act::attn:
      return f.attn_;
    case act::gate:
      return f.ff_gate_;
    case act::up:
      return f.ff_up_;
  }
  return nullptr;
}

int64_t cpu_pass::width(act a) const {
  switch (a) {
    case act::x:
    case act::xb:
      return c.n_embd;
    case act::q:
    case act::attn:
      return c.q_dim();
    case act::k:
    case act::v:
      return c.kv_dim();
    case act::gate:
    case act::up:
      return c.n_ff;
  }
  return 0;
}

void cpu_pass::rotate_rows(float* a, int64_t width, int64_t n_heads, int64_t r0, int64_t r1) const {
  if (!rotate || r1 <= r0) return;
  kernels::cpu::hadamard_heads(a + r0 * width, r1 - r0, width, static_cast<int>(n_heads), static_cast<int>(c.head_dim));
}

void cpu_pass::store_runs(int64_t layer, int64_t i0, int64_t i1, float* k, float* v) {
  const int64_t KV = c.kv_dim();
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t r0 = f.run_start_[static_cast<size_t>(i)], r1 = f.run_start_[static_cast<size_t>(i) + 1];
    const int64_t s = seqs[r0], len = r1 - r0, p0 = positions[r0];
    rotate_rows(k, KV, c.n_head_kv, r0, r1);
    rotate_rows(v, KV, c.n_head_kv, r0, r1);
    if (f.kv_pool_) {
      f.paged_store(s, layer, p0, k + r0 * KV, v + r0 * KV, len);
    } else {
      kernels::cpu::kv_store(f.k_cache(s, layer), f.kv_type_, p0, k + r0 * KV, len, KV);
      kernels::cpu::kv_store(f.v_cache(s, layer), f.kv_type_, p0, v + r0 * KV, len, KV);
    }
  }
}

void cpu_pass::set_runs(int64_t layer, int64_t i0, int64_t i1, const float* q, float* out) {
  const int64_t Q = c.q_dim();
  for (int64_t i = i0; i < i1; ++i) {
    const int64_t r0 = f.run_start_[static_cast<size_t>(i)], r1 = f.run_start_[static_cast<size_t>(i) + 1];
    const int64_t s = seqs[r0], len = r1 - r0, p0 = positions[r0];
    kernels::cpu::attention_run& run = f.runs_[static_cast<size_t>(i)];
    if (f.kv_pool_) {
      const kernels::cpu::kv_pages pages{f.kv_pool_->table(s).data(), f.kv_pool_->block_tokens(), f.paged_block_stride_};
      run = {q + r0 * Q, len, p0, f.kv_pool_->data() + f.paged_offset(layer, 0), f.kv_pool_->data() + f.paged_offset(layer, 1), out + r0 * Q, pages};
    } else {
      run = {q + r0 * Q, len, p0, f.k_cache(s, layer), f.v_cache(s, layer), out + r0 * Q};
    }
    run.prompt_rows = std::clamp<int64_t>(f.prompt_end_[static_cast<size_t>(s)] - p0, 0, len);
  }
}

void cpu_pass::embed(const weight_view& table, int64_t row0) {
  const int64_t D = c.n_embd;
  for (int64_t r = 0; r < n; ++r)
    if (tokens[r] >= row0 && tokens[r] < row0 + table.rows) dequantize_weight_row(table, tokens[r] - row0, f.x_ + r * D);
}

void cpu_pass::run_layer(int64_t, layer_body body) {
  if (!team) {
    step_ops o(*this);
    body(o);
    return;
  }
  pool->run_team([&](int member, kernels::cpu::team& t) {
    team_ops o(*this, member, t, team_scratch + static_cast<size_t>(member) * team_scratch_floats);
    body(o);
  });
}

void cpu_pass::output_norm(const float* w) {
  const int64_t D = c.n_embd;
  const int64_t rows = out_rows ? n_out : n;
  for (int64_t k = 0; k < rows; ++k) kernels::cpu::rms_norm(f.x_ + (out_rows ? out_rows[k] : k) * D, w, f.xb_ + k * D, D, c.rms_eps);
}

void cpu_pass::head(const weight_view& w, int64_t col0) {
  const int64_t D = c.n_embd, V = f.n_vocab_;
  const int64_t rows = out_rows ? n_out : n;
  auto fast_out = [&](int64_t k) { return fast(out_rows ? out_rows[k] : k); };
  auto project = [&](float* y, int64_t k0, int64_t k1, bool fst) {
    kernels::cpu::matmul(w.type, w.data, w.rows, w.cols, f.xb_ + k0 * D, k1 - k0, y, f.pool_, w.layout, order_for(fst));
  };
  if (col0 == 0 && w.rows == V) {
    by_arithmetic(rows, fast_out, [&](int64_t k0, int64_t k1, bool fst) { project(logits + k0 * V, k0, k1, fst); });
    return;
  }
  // A piece of a head cut into pieces: its logits are columns [col0, col0 + w.rows).
  const int64_t pr = w.rows;
  f.head_scratch_.resize(static_cast<size_t>(rows * pr));
  by_arithmetic(rows, fast_out, [&](int64_t k0, int64_t k1, bool fst) { project(f.head_scratch_.data() + k0 * pr, k0, k1, fst); });
  for (int64_t r = 0; r < rows; ++r) std::copy_n(f.head_scratch_.data() + r * pr, pr, logits + r * V + col0);
}

}  // namespace tandem::models
