// Interleaving: passes of a higher-priority model between the layers of a lower-priority
// model's pass (engine.h). The pass in flight holds its layers' leases and its stream slots,
// so nothing is planned meanwhile: only a model that needs no memory action (all its weights
// on the device) may run, and only with the policy's consent (policy::may_interleave).
#include <optional>

#include <spdlog/spdlog.h>

#include "runtime/log.h"
#include "policy/planner.h"
#include "runtime/engine.h"
#include "runtime/engine_state.h"
#include "runtime/memory_plan.h"

namespace tandem::runtime {

engine::served* engine::interleavable(const served& outer, clock_type::duration paused) {
  const configs::model_entry* o = roster_->find(outer.cfg.name);
  if (!o || outer.interleave.failed) return nullptr;
  std::optional<memory::arbiter_snapshot> snap;  // taken once, only when some model has work
  served* best = nullptr;
  const configs::model_entry* best_entry = nullptr;
  for (auto& m : models_) {
    if (m.get() == &outer) continue;
    // Work it can run or start. Preempted sequences need their KV copied back first: that is
    // left to the plan, like every other memory action.
    const bool work = m->queues.preempted.empty() && (!m->queues.running.empty() || (!m->queues.waiting.empty() && !m->free_seqs.empty()));
    if (!work) continue;
    const configs::model_entry* e = roster_->find(m->cfg.name);
    if (!e || !policy::may_interleave(*roster_, *o, *e, paused)) continue;
    if (best && e->priority <= best_entry->priority) continue;
    if (!snap) snap = m->cfg.placement->arbiter().snapshot();
    if (!all_resident(*snap, m->cfg.name)) continue;
    best = m.get();
    best_entry = e;
  }
  return best;
}

void engine::interleave(served& outer) noexcept {
  const auto t0 = clock_type::now();
  std::unique_lock lock(m_, std::defer_lock);
  served* inner = nullptr;
  try {
    lock.lock();
    while (!stop_) {
      take_submissions();
      finish_swap_ins();  // (a swap-in that landed during this pass is over: full-size chunks no more)
      // The paused pass's wait counts from the first time other passes ran inside it.
      inner = interleavable(outer, outer.interleave.paused_since ? clock_type::now() - *outer.interleave.paused_since : clock_type::duration{});
      if (!inner) break;
      drop_cancelled(*inner);
      admit(*inner);
      // Nothing could start (its KV pool is full): that waits for the plan, after this pass.
      if (inner->queues.running.empty()) break;
      if (!outer.interleave.paused_since) outer.interleave.paused_since = clock_type::now();
      ++inner->interleave.passes;
      run_pass(*inner, lock, false);
      inner = nullptr;
    }
  } catch (const std::exception& e) {
    // The paused pass goes on whatever happened here; the model whose admission failed ends
    // its requests as iterate would, and nothing more is interleaved into this pass.
    runtime::logger().error("engine: interleaving a pass of another model beside '{}' failed: {}", outer.cfg.name, e.what());
    outer.interleave.failed = true;
    if (inner) {
      if (!lock.owns_lock()) lock.lock();
      end_all(*inner, finish_reason::error, e.what());
    }
  }
  // Not this pass's own cost (the ITL budget's estimates of it).
  outer.interleave.seconds += std::chrono::duration<double>(clock_type::now() - t0).count();
}

}  // namespace tandem::runtime
