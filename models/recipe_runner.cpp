#include "models/recipe_runner.h"

#include <stdexcept>
#include <string>
#include <utility>

#include "models/weight_plan.h"

namespace tandem::models {
namespace {

// A segment leased for the span of its use. On an asynchronous backend the work reading it
// must have run before it goes back; end() waits for that, the destructor (an exception
// unwinding the pass) releases it whatever the backend's state, so no lease outlives a pass.
class held_segment {
 public:
  held_segment() = default;
  held_segment(weight_residency* r, pass_backend* b, int seg) : r_(r), b_(b), seg_(seg) {
    base = r->acquire(seg);
    if (!base) {
      r_ = nullptr;
      throw std::logic_error("forward pass: segment " + std::to_string(seg) +
                             " of the model could not be made resident (no stream slot free)");
    }
  }
  held_segment(held_segment&& o) noexcept
      : base(std::exchange(o.base, nullptr)), r_(std::exchange(o.r_, nullptr)), b_(o.b_), seg_(o.seg_) {}
  held_segment& operator=(held_segment&& o) noexcept {
    if (this != &o) {
      drop();
      base = std::exchange(o.base, nullptr);
      r_ = std::exchange(o.r_, nullptr);
      b_ = o.b_;
      seg_ = o.seg_;
    }
    return *this;
  }
  held_segment(const held_segment&) = delete;
  held_segment& operator=(const held_segment&) = delete;
  ~held_segment() { drop(); }
  explicit operator bool() const { return r_ != nullptr; }

  // Releases once the queued work is done (waits for it on an asynchronous backend).
  void end() {
    if (!r_) return;
    if (b_->asynchronous() && !r_->fixed()) {
      try {
        b_->drain();
      } catch (...) {
        drop();  // the backend failed: nothing more reads the segment
        throw;
      }
    }
    drop();
  }
  // Releases after the work recorded under `slot` has run, not waiting for what came after.
  void end_after(int slot) {
    if (!r_) return;
    try {
      b_->wait_mark(slot);
    } catch (...) {
      drop();
      throw;
    }
    drop();
  }

  const std::byte* base = nullptr;

 private:
  void drop() noexcept {
    if (r_) std::exchange(r_, nullptr)->release(seg_);
    base = nullptr;
  }
  weight_residency* r_ = nullptr;
  pass_backend* b_ = nullptr;
  int seg_ = 0;
};

}  // namespace

void run_embedding(pass_backend& b, const model& m, weight_residency* residency, std::span<const int32_t> tokens) {
  if (!residency) return b.embed(m.weights().token_embd, 0);
  const auto& c = m.config();
  const weight_plan& plan = m.plan();
  // The first layers start copying while the rows are looked up, piece by piece.
  for (int d = 0; d < residency->prefetch_depth() && d < c.n_layer; ++d) residency->prefetch(plan.layer_segment(d));
  for (const auto& piece : plan.token_embd) {
    const int64_t end = piece.row0 + piece.m.view.rows;
    bool wanted = false;
    for (size_t i = 0; i < tokens.size() && !wanted; ++i) wanted = tokens[i] >= piece.row0 && tokens[i] < end;
    if (!wanted) continue;  // not copied in for nothing
    held_segment held(residency, &b, piece.segment);
    b.embed(bind_matrix_at(piece.m, held.base), piece.row0);
    held.end();
  }
}

void run_layers(const recipe& r, pass_backend& b, const model& m, weight_residency* residency, bool want_logits,
                const std::function<void()>& between_layers) {
  const auto& c = m.config();
  if (!residency) {
    const auto& w = m.weights();
    for (int64_t l = 0; l < c.n_layer; ++l) {
      const layer_weights& L = w.layers[static_cast<size_t>(l)];
      auto body = [&](layer_ops& o) { r.layer(o, c, L, l); };
      b.run_layer(l, body);
      if (between_layers && l + 1 < c.n_layer) between_layers();
    }
    if (!want_logits) return;
    b.output_norm(w.output_norm);
    b.head(w.output, 0);
    return;
  }
  const weight_plan& plan = m.plan();
  const int depth = residency->prefetch_depth();
  auto prefetch_after = [&](int seg, int ahead) {
    for (int k = 1; k <= ahead && seg + k <= plan.last_segment(); ++k) residency->prefetch(seg + k);
  };

  // On an asynchronous backend with a prefetch depth of 1 or more (two stream slots or
  // more), layer l's segment is acquired while layer l-1 still computes; l-1's goes back
  // once a mark after its work has passed, so the device never waits for the host between
  // layers. Otherwise a layer's segment goes back before the next one is asked for (one slot
  // is then enough).
  const bool overlap = b.asynchronous() && !residency->fixed() && depth >= 1;
  held_segment cur, prev;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const int seg = plan.layer_segment(l);
    if (overlap) prev = std::move(cur);
    cur = held_segment(residency, &b, seg);  // the last layer's also holds the output norm
    // While the previous layer is still held one slot fewer is free: asking for depth
    // segments ahead would make the arbiter retarget the slot that holds the next one.
    prefetch_after(seg, prev ? depth - 1 : depth);
    const layer_weights L = bind_layer(plan.layers[static_cast<size_t>(l)], cur.base);
    auto body = [&](layer_ops& o) { r.layer(o, c, L, l); };
    b.run_layer(l, body);
    if (overlap) {
      b.mark(static_cast<int>(l % 2));
      if (prev) {
        prev.end_after(static_cast<int>((l + 1) % 2));  // layer l-1's mark
        prefetch_after(seg, depth);                     // into the slot just freed
      }
    }
    if (l + 1 < c.n_layer) {
      if (!overlap) cur.end();
      if (between_layers) between_layers();
    }
  }
  if (want_logits) b.output_norm(bind_vector_at(plan.output_norm, cur.base));
  cur.end();
  if (!want_logits) return;

  // The head piece by piece; a piece's logits are columns [row0, row0 + its rows).
  for (size_t i = 0; i < plan.output.size(); ++i) {
    const auto& piece = plan.output[i];
    held_segment held(residency, &b, piece.segment);
    for (int d = 1; d <= depth && i + static_cast<size_t>(d) < plan.output.size(); ++d)
      residency->prefetch(plan.output[i + static_cast<size_t>(d)].segment);
    b.head(bind_matrix_at(piece.m, held.base), piece.row0);
    held.end();
  }
}

void run_recipe(const recipe& r, pass_backend& b, const model& m, weight_residency* residency,
                std::span<const int32_t> tokens, bool want_logits, const std::function<void()>& between_layers) {
  run_embedding(b, m, residency, tokens);
  run_layers(r, b, m, residency, want_logits, between_layers);
}

}  // namespace tandem::models
