#include "models/recipe_runner.h"

#include <stdexcept>
#include <string>
#include <utility>

#include "models/weight_plan.h"

namespace tandem::models {

segment_lease::segment_lease(weight_residency* r, pass_backend* b, int seg) : r_(r), b_(b), seg_(seg) {
  base = r->acquire(seg);
  if (!base) {
    r_ = nullptr;
    throw std::logic_error("forward pass: segment " + std::to_string(seg) + " of the model could not be made resident (no stream slot free)");
  }
}

segment_lease::segment_lease(segment_lease&& o) noexcept
    : base(std::exchange(o.base, nullptr)), r_(std::exchange(o.r_, nullptr)), b_(o.b_), seg_(o.seg_) {}

segment_lease& segment_lease::operator=(segment_lease&& o) noexcept {
  if (this != &o) {
    drop();
    base = std::exchange(o.base, nullptr);
    r_ = std::exchange(o.r_, nullptr);
    b_ = o.b_;
    seg_ = o.seg_;
  }
  return *this;
}

void segment_lease::end() {
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

void segment_lease::end_after(int slot) {
  if (!r_) return;
  try {
    b_->wait_mark(slot);
  } catch (...) {
    drop();
    throw;
  }
  drop();
}

void segment_lease::drop() noexcept {
  if (r_) std::exchange(r_, nullptr)->release(seg_);
  base = nullptr;
}

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
    segment_lease held(residency, &b, piece.segment);
    b.embed(bind_matrix_at(piece.m, held.base), piece.row0);
    held.end();
  }
}

layer_walk::layer_walk(const recipe& r, pass_backend& b, const model& m, weight_residency* residency, bool want_logits)
    : r_(r), b_(b), m_(m), residency_(residency), want_logits_(want_logits), n_layer_(m.config().n_layer) {
  if (!residency_) return;
  depth_ = residency_->prefetch_depth();
  // On an asynchronous backend with a prefetch depth of 1 or more (two stream slots or
  // more), layer l's segment is acquired while layer l-1 still computes; l-1's goes back
  // once a mark after its work has passed, so the device never waits for the host between
  // layers. Otherwise a layer's segment goes back before the next one is asked for (one slot
  // is then enough).
  overlap_ = b_.asynchronous() && !residency_->fixed() && depth_ >= 1;
}

layer_walk::~layer_walk() {
  // Abandoned midway: what was queued may still read the held segments.
  if (!done() && b_.asynchronous() && (cur_ || prev_)) {
    try {
      b_.drain();
    } catch (...) {  // the backend failed: nothing more reads them
    }
  }
}

void layer_walk::prefetch_after(int seg, int ahead) {
  const weight_plan& plan = m_.plan();
  for (int k = 1; k <= ahead && seg + k <= plan.last_segment(); ++k) residency_->prefetch(seg + k);
}

bool layer_walk::advance() {
  if (done()) return true;
  const auto& c = m_.config();
  const int64_t l = next_++;  // n_layer >= 1 (model_config)
  if (!residency_) {
    const layer_weights& L = m_.weights().layers[static_cast<size_t>(l)];
    auto body = [&](layer_ops& o) { r_.layer(o, c, L, l); };
    b_.run_layer(l, body);
    if (l + 1 < n_layer_) return false;
    ++next_;
    run_head();
    return true;
  }
  const weight_plan& plan = m_.plan();
  const int seg = plan.layer_segment(l);
  if (overlap_) prev_ = std::move(cur_);
  cur_ = segment_lease(residency_, &b_, seg);  // the last layer's also holds the output norm
  // While the previous layer is still held one slot fewer is free: asking for depth
  // segments ahead would make the arbiter retarget the slot that holds the next one.
  prefetch_after(seg, prev_ ? depth_ - 1 : depth_);
  const layer_weights L = bind_layer(plan.layers[static_cast<size_t>(l)], cur_.base);
  auto body = [&](layer_ops& o) { r_.layer(o, c, L, l); };
  b_.run_layer(l, body);
  if (overlap_) {
    b_.mark(static_cast<int>(l % 2));
    if (prev_) {
      prev_.end_after(static_cast<int>((l + 1) % 2));  // layer l-1's mark
      prefetch_after(seg, depth_);                     // into the slot just freed
    }
  }
  if (l + 1 < n_layer_) {
    if (!overlap_) cur_.end();
    return false;
  }
  ++next_;
  run_head();
  return true;
}

void layer_walk::run_head() {
  if (!residency_) {
    if (!want_logits_) return;
    b_.output_norm(m_.weights().output_norm);
    b_.head(m_.weights().output, 0);
    return;
  }
  const weight_plan& plan = m_.plan();
  if (want_logits_) b_.output_norm(bind_vector_at(plan.output_norm, cur_.base));
  cur_.end();
  if (!want_logits_) return;
  // The head piece by piece; a piece's logits are columns [row0, row0 + its rows).
  for (size_t i = 0; i < plan.output.size(); ++i) {
    const auto& piece = plan.output[i];
    segment_lease held(residency_, &b_, piece.segment);
    for (int d = 1; d <= depth_ && i + static_cast<size_t>(d) < plan.output.size(); ++d)
      residency_->prefetch(plan.output[i + static_cast<size_t>(d)].segment);
    b_.head(bind_matrix_at(piece.m, held.base), piece.row0);
    held.end();
  }
}

void run_recipe(const recipe& r, pass_backend& b, const model& m, weight_residency* residency, std::span<const int32_t> tokens, bool want_logits) {
  run_embedding(b, m, residency, tokens);
  layer_walk(r, b, m, residency, want_logits).finish();
}

}  // namespace tandem::models
