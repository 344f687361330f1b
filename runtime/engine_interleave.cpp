// Interleaving: passes of a higher-priority model between the layers of a lower-priority
// model's pass (engine.h). The pass in flight holds its layers' leases and its stream slots,
// so nothing is planned meanwhile: only a model that needs no memory action (all its weights
// on the device) may run, and only with the policy's consent (policy::may_interleave).
#include <spdlog/spdlog.h>

#include "policy/planner.h"
#include "runtime/engine.h"
#include "runtime/engine_state.h"
#include "runtime/memory_plan.h"

namespace tandem::runtime {

engine::served* engine::interleavable(const served& outer, clock_type::duration paused) {
  const configs::model_entry* o = roster_->find(outer.cfg.name);
  if (!o) return nullptr;
  served* best = nullptr;
  const configs::model_entry* best_entry = nullptr;
  for (auto& m : models_) {
    if (m.get() == &outer) continue;
    const bool work = !m->running.empty() || !m->preempted.empty() || (!m->waiting.empty() && !m->free_seqs.empty());
    if (!work) continue;
    const configs::model_entry* e = roster_->find(m->cfg.name);
    if (!e || !policy::may_interleave(*roster_, *o, *e, paused)) continue;
    if (!best || e->priority > best_entry->priority) {
      best = m.get();
      best_entry = e;
    }
  }
  if (!best) return nullptr;
  return all_resident(best->cfg.placement->arbiter().snapshot(), best->cfg.name) ? best : nullptr;
}

void engine::interleave(served& outer, clock_type::time_point paused_since) noexcept {
  try {
    std::unique_lock lock(m_);
    while (!stop_) {
      take_submissions();
      served* inner = interleavable(outer, clock_type::now() - paused_since);
      if (!inner) return;
      drop_cancelled(*inner);
      admit(*inner);
      // Nothing could start (its KV pool is full): that waits for the plan, after this pass.
      if (inner->running.empty()) return;
      run_pass(*inner, lock, false);
    }
  } catch (const std::exception& e) {
    // The paused pass goes on whatever happened here (the inner pass's own errors were
    // handed to its requests by run_pass).
    spdlog::error("engine: interleaving a pass of another model beside '{}' failed: {}", outer.cfg.name, e.what());
  }
}

}  // namespace tandem::runtime
