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

void engine::interleave(served& outer) noexcept {
  const auto t0 = clock_type::now();
  try {
    std::unique_lock lock(m_);
    while (!stop_) {
      take_submissions();
      // The paused pass's wait counts from the first time other passes ran inside it.
      served* inner = interleavable(outer, outer.paused_since ? clock_type::now() - *outer.paused_since : clock_type::duration{});
      if (!inner) break;
      drop_cancelled(*inner);
      admit(*inner);
      // Nothing could start (its KV pool is full): that waits for the plan, after this pass.
      if (inner->running.empty()) break;
      if (!outer.paused_since) outer.paused_since = clock_type::now();
      run_pass(*inner, lock, false);
    }
  } catch (const std::exception& e) {
    // The paused pass goes on whatever happened here (the inner pass's own errors were
    // handed to its requests by run_pass).
    spdlog::error("engine: interleaving a pass of another model beside '{}' failed: {}", outer.cfg.name, e.what());
  }
  // Not this pass's own cost (the ITL budget's estimates of it).
  outer.interleaved_s += std::chrono::duration<double>(clock_type::now() - t0).count();
}

}  // namespace tandem::runtime
