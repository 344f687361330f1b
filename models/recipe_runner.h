// One forward pass of any recipe on any backend: the token embedding, the layers and the
// output head, with the weight lease and prefetch schedule of a model whose segments an
// arbiter streams (weight_residency.h). The backend (pass_backend) owns the pass's rows,
// activations, KV cache and logits; this file owns the order of the work and which weights
// are held while it runs.
#pragma once

#include <cstdint>
#include <functional>
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

// The token embedding of the pass's rows (tokens), piece by piece: the first part of
// run_recipe, apart for a backend that replays the rest from a recorded graph. Starts the
// first layers' copies.
void run_embedding(pass_backend& b, const model& m, weight_residency* residency, std::span<const int32_t> tokens);
// The layers and the output head: the rest of run_recipe.
void run_layers(const recipe& r, pass_backend& b, const model& m, weight_residency* residency, bool want_logits,
                const std::function<void()>& between_layers);

// Runs recipe r over the pass the backend holds: run_embedding, then run_layers. residency null: the weights are m.weights()
// (owned by the model, or device copies the backend binds itself); otherwise each segment is
// leased from it for the span of its use, the next prefetch_depth() segments copying ahead.
// between_layers, when set, runs between two layers (not after the last) while the pass holds
// only its current layer's lease. tokens: the pass's rows' tokens (which embedding pieces are
// needed). want_logits false: the output head is skipped. Exceptions from the backend
// propagate with every lease released.
void run_recipe(const recipe& r, pass_backend& b, const model& m, weight_residency* residency,
                std::span<const int32_t> tokens, bool want_logits, const std::function<void()>& between_layers);

}  // namespace tandem::models
