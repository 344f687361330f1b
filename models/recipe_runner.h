// One forward pass of any recipe on any backend: the token embedding, the layers and the
// output head, with the weight lease and prefetch schedule of a model whose segments an
// arbiter streams (weight_residency.h). The backend (pass_backend) owns the pass's rows,
// activations, KV cache and logits; this file owns the order of the work and which weights
// are held while it runs.
#pragma once

#include <cstdint>
#include <span>
#include <type_traits>

#include "models/model.h"
#include "models/recipe.h"
#include "models/weight_residency.h"

namespace tandem::models {

// For the span of a pass: every segment held at once when all are on the device
// (weight_residency::hold_all), so the pass takes no per-layer lease.
class whole_pass_hold {
 public:
  explicit whole_pass_hold(weight_residency* r) : r_(r && r->hold_all() ? r : nullptr) {}
  ~whole_pass_hold() {
    if (r_) r_->release_all();
  }
  whole_pass_hold(const whole_pass_hold&) = delete;
  whole_pass_hold& operator=(const whole_pass_hold&) = delete;
  explicit operator bool() const { return r_ != nullptr; }

 private:
  weight_residency* r_;
};

// A non-owning reference to a callable taking layer_ops& (no allocation per layer).
class layer_body {
 public:
  template <class F>
  requires(!std::is_same_v<std::remove_cvref_t<F>, layer_body> && std::is_invocable_v<F&, layer_ops&>)
      layer_body(F& f)  // NOLINT: implicit, as a function reference
      : object_(&f), call_([](void* o, layer_ops& ops) { (*static_cast<F*>(o))(ops); }) {}
  void operator()(layer_ops& ops) const { call_(object_, ops); }

 private:
  void* object_;
  void (*call_)(void*, layer_ops&);
};

// The pass-level work of a backend, around the layers. The rows of the pass (tokens,
// sequences, positions, which rows want logits) were set on the backend before the pass.
class pass_backend {
 public:
  virtual ~pass_backend() = default;
  // Rows whose token lies in [row0, row0 + table.rows) get row (token - row0) of table in x.
  virtual void embed(const weight_view& table, int64_t row0) = 0;
  // Runs one layer: body(ops) once, or once per member of a team of threads (each with its
  // own ops), with the results of running it once.
  virtual void run_layer(int64_t layer, layer_body body) = 0;
  // The rows that want logits, normed by w (n_embd), into consecutive rows of xb.
  virtual void output_norm(const float* w) = 0;
  // For each of those rows k: logits[k][col0 .. col0 + head.rows) = xb[k] · head^T.
  virtual void head(const weight_view& head, int64_t col0) = 0;
  // Whether calls return before their work has run (a CUDA stream): a segment the work
  // reads may then go back to the arbiter only once drain() or a mark has passed.
  virtual bool asynchronous() const = 0;
  // Waits for all work queued so far.
  virtual void drain() = 0;
  // Records that the work queued so far is done once it has run, under `slot` (0 or 1), and
  // waits for the work recorded under a slot. No-ops on a synchronous backend.
  virtual void mark(int slot) = 0;
  virtual void wait_mark(int slot) = 0;
};

// A segment leased for the span of its use. On an asynchronous backend the work reading it
// must have run before it goes back; end() waits for that, the destructor (an exception
// unwinding the pass) releases it whatever the backend's state, so no lease outlives a pass.
class segment_lease {
 public:
  segment_lease() = default;
  // Throws std::logic_error when the arbiter cannot make the segment resident.
  segment_lease(weight_residency* r, pass_backend* b, int seg);
  segment_lease(segment_lease&& o) noexcept;
  segment_lease& operator=(segment_lease&& o) noexcept;
  segment_lease(const segment_lease&) = delete;
  segment_lease& operator=(const segment_lease&) = delete;
  ~segment_lease() { drop(); }
  explicit operator bool() const { return r_ != nullptr; }

  // Releases once the queued work is done (waits for it on an asynchronous backend).
  void end();
  // Releases after the work recorded under `slot` has run, not waiting for what came after.
  void end_after(int slot);

  const std::byte* base = nullptr;

 private:
  void drop() noexcept;
  weight_residency* r_ = nullptr;
  pass_backend* b_ = nullptr;
  int seg_ = 0;
};

// The token embedding of the pass's rows (tokens), piece by piece: the first part of a pass,
// before its layer_walk. Starts the first layers' copies.
void run_embedding(pass_backend& b, const model& m, weight_residency* residency, std::span<const int32_t> tokens);

// The layers and the output head of one pass, one layer per advance(): the points between
// two advance() calls are where the executor yields (forward_pass::begin/advance), with none
// of the pass's work running on the host and only the current layer's lease held.
// residency null: the weights are m.weights() (owned by the model, or device copies the
// backend binds itself); otherwise each segment is leased from it for the span of its use,
// the next prefetch_depth() segments copying ahead. want_logits false: the output head is
// skipped. An exception from the backend propagates with every lease released; a walk
// destroyed unfinished waits for the work it queued, then releases its leases.
class layer_walk {
 public:
  layer_walk(const recipe& r, pass_backend& b, const model& m, weight_residency* residency, bool want_logits);
  ~layer_walk();
  layer_walk(const layer_walk&) = delete;
  layer_walk& operator=(const layer_walk&) = delete;

  // Runs the next layer, and with the last one the output norm and head: true once all of
  // the pass has been queued (and, on a synchronous backend, has run).
  bool advance();
  // Every remaining layer and the head.
  void finish() {
    while (!advance()) {
    }
  }
  bool done() const { return next_ > n_layer_; }

 private:
  void prefetch_after(int seg, int ahead);
  void run_head();

  const recipe& r_;
  pass_backend& b_;
  const model& m_;
  weight_residency* residency_;
  bool want_logits_;
  int64_t n_layer_;
  int64_t next_ = 0;  // the next layer to run; n_layer_ + 1 once done
  int depth_ = 0;
  bool overlap_ = false;
  segment_lease cur_, prev_;
};

// One whole pass of recipe r over the pass the backend holds: run_embedding, then a
// layer_walk to its end. tokens: the pass's rows' tokens (which embedding pieces are needed).
void run_recipe(const recipe& r, pass_backend& b, const model& m, weight_residency* residency, std::span<const int32_t> tokens, bool want_logits);

}  // namespace tandem::models
