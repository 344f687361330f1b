// The engine's placement of models by the planner: the plan each iteration, its memory
// actions, and the check that every roster model could run at all.
#include <algorithm>
#include <stdexcept>

#include <spdlog/spdlog.h>

#include "policy/planner.h"
#include "runtime/engine.h"
#include "runtime/engine_state.h"
#include "runtime/memory_plan.h"

namespace tandem::runtime {

void engine::check_placeable() const {
  // A model that cannot run even with the device to itself would leave its requests waiting
  // for ever: refuse the configuration instead.
  auto& arb = models_.front()->cfg.placement->arbiter();
  const auto snap = arb.snapshot();
  const uint64_t block = arb.config().block_bytes;
  auto rounded = [&](uint64_t b) { return (b + block - 1) / block * block; };
  uint64_t weights_on_device = 0;
  for (const auto& m : snap.models)
    for (const auto& seg : m.segments)
      if (seg.device != memory::residency::absent) weights_on_device += rounded(seg.bytes);
  const uint64_t other = snap.device.used - weights_on_device;  // KV pools, scratch, slots
  for (const auto& s : models_) {
    const auto it = std::find_if(snap.models.begin(), snap.models.end(), [&](const auto& m) { return m.name == s->cfg.name; });
    uint64_t weights = 0, largest = 0;
    for (const auto& seg : it->segments) {
      weights += rounded(seg.bytes);
      largest = std::max(largest, rounded(seg.bytes));
    }
    // Streamed, the planner wants half the weights on the device (policy/planner.h, 2b) and the
    // pass needs its stream slots.
    const uint64_t slots = static_cast<uint64_t>(s->cfg.placement->prefetch_depth() + 1) * largest;
    const uint64_t need = config_.roster->policy.stream ? std::min(weights, std::max(slots, weights / 2)) : weights;
    if (other + need > snap.device.capacity)
      throw std::invalid_argument("engine: model '" + s->cfg.name + "' cannot run on a device of " + std::to_string(snap.device.capacity) +
                                  " bytes: it needs " + std::to_string(need) + (need < weights ? " (stream slots)" : " (weights)") +
                                  " beside " + std::to_string(other) + " of KV pools and scratch");
  }
}

engine::~engine() {
  {
    std::lock_guard lock(m_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

engine::served* engine::plan_and_pick() {
  const auto now = clock_type::now();
  auto& arb = models_.front()->cfg.placement->arbiter();
  std::vector<model_facts> facts;
  for (const auto& m : models_) {
    model_facts f;
    f.name = m->cfg.name;
    f.running = static_cast<int>(m->running.size());
    f.preempted = static_cast<int>(m->preempted.size());
    f.queued = static_cast<int>(m->waiting.size());
    // The oldest request waiting to start or to resume: its wait ages the model.
    for (const auto& a : m->waiting)  // the front is not always the oldest (prefer_cached_prefix)
      if (f.oldest == policy::time_point{} || a->arrived < f.oldest) f.oldest = a->arrived;
    for (const auto& a : m->preempted)
      if (f.oldest == policy::time_point{} || a->arrived < f.oldest) f.oldest = a->arrived;
    f.last_used = m->last_pass;
    f.loaded_at = m->loaded_at;
    f.arrivals_per_s = m->rate_at(now);
    facts.push_back(std::move(f));
  }
  const double link = config_.link_gb_s > 0 ? config_.link_gb_s
                      : arb.device_backend().info().link_gbps > 0 ? arb.device_backend().info().link_gbps
                                                                  : 25.0;
  const auto snap = planner_snapshot(arb.snapshot(), arb.config().block_bytes, facts, link, 2.0);
  const auto plan = policy::make_plan(*config_.roster, snap, planner_demand(facts), now);
  for (const auto& act : plan.actions) {
    served* t = find(act.model);
    if (!t) continue;
    if (act.kind == policy::action_kind::preempt) {
      preempt_all(*t);
    } else if (act.kind != policy::action_kind::resume) {
      const bool was_on = std::any_of(snap.models.begin(), snap.models.end(), [&](const auto& m) { return m.name == act.model && m.on_device; });
      auto st = apply_memory_action(*t->cfg.placement, act);
      if (st == memory::status::no_space &&
          (act.kind == policy::action_kind::stage || act.kind == policy::action_kind::load)) {
        // Weights come before cached prefixes: give the host tier back and try again.
        int dropped = 0;
        for (auto& m : models_)
          if (m->cache) dropped += m->cache->drop_host(m->cache->host_blocks());
        if (dropped > 0) st = apply_memory_action(*t->cfg.placement, act);
      }
      if (act.kind == policy::action_kind::load && !was_on) t->loaded_at = now;
      spdlog::debug("engine: {} {} ({}): {}", policy::action_name(act.kind), act.model, act.why, memory::status_name(st));
    }
  }
  if (plan.run.empty()) return nullptr;
  served* s = find(plan.run);
  return s && runnable(arb.snapshot(), s->cfg.name) ? s : nullptr;
}

void engine::preempt_all(served& s) {
  // One at a time off the running list, so that a copy that throws leaves every sequence in
  // exactly one list for the error path to end.
  while (!s.running.empty()) {
    auto a = s.running.back();
    preempt(s, *a);
    a->preempt = false;
    ++preemptions_;
    s.running.pop_back();
    s.preempted.push_front(std::move(a));
  }
  s.publish();
}

}  // namespace tandem::runtime
