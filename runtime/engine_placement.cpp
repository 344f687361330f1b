// The engine's placement of models by the planner: the plan each iteration, its memory
// actions, and the check that every roster model could run at all.
#include <algorithm>
#include <limits>
#include <stdexcept>

#include <spdlog/spdlog.h>

#include "runtime/log.h"
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
    const uint64_t need = roster_->policy.stream ? std::min(weights, std::max(slots, weights / 2)) : weights;
    if (other + need > snap.device.capacity)
      throw std::invalid_argument("engine: model '" + s->cfg.name + "' cannot run on a device of " + std::to_string(snap.device.capacity) +
                                  " bytes: it needs " + std::to_string(need) + (need < weights ? " (stream slots)" : " (weights)") + " beside " +
                                  std::to_string(other) + " of KV pools and scratch");
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

void engine::end_unplaceable(const policy::snapshot& snap, std::span<const model_facts> facts) {
  for (size_t i = 0; i < models_.size() && i < snap.models.size(); ++i) {
    served& s = *models_[i];
    if (!s.kv->elastic() || s.queues.preempted.empty()) continue;
    // The most pages one of its sequences could ever hold: the device without what no
    // eviction frees (scratch, every floor but its own) and without its own weights. Judged
    // only while all its weights are on the device (a model off it waits for its turn).
    const policy::model_state& st = snap.models[i];
    if (st.name != s.cfg.name || !st.on_device || st.device_bytes != 0) continue;
    const uint64_t weights = st.weight_bytes;
    const uint64_t fixed = snap.device_other > facts[i].kv_floor_bytes ? snap.device_other - facts[i].kv_floor_bytes : 0;
    const uint64_t room = snap.device_capacity > fixed + weights ? snap.device_capacity - fixed - weights : 0;
    const int64_t most = static_cast<int64_t>(room / s.kv->block_footprint());
    for (auto it = s.queues.preempted.begin(); it != s.queues.preempted.end();) {
      active& a = **it;
      const int64_t need = (a.seq >= 0 && s.kv->swapped_out(a.seq) ? s.kv->swapped_blocks(a.seq) : 0) + 1;
      if (need <= most) {
        ++it;
        continue;
      }
      // Waiting would be for ever: say so instead of truncating it.
      const std::string why = "model '" + s.cfg.name + "': the sequence needs " + std::to_string(need) + " KV pages of " +
                              std::to_string(s.kv->block_footprint()) + " bytes; the device can give it at most " + std::to_string(most) +
                              " beside the model's weights";
      runtime::logger().warn("engine: {}", why);
      retire(s, a, finish_reason::error, why);
      it = s.queues.preempted.erase(it);
    }
  }
}

uint64_t engine::kv_wanted(const served& s) const {
  // Only an elastic pool takes pages from the device budget the planner can free.
  if (!s.kv->elastic()) return 0;
  const int64_t bt = s.kv->block_tokens();
  int64_t pages = 0;
  for (const auto& a : s.queues.preempted)  // swapped out, or to be evaluated again
    pages += (a->seq >= 0 && s.kv->swapped_out(a->seq) ? s.kv->swapped_blocks(a->seq) : static_cast<int64_t>(a->history.size()) / bt) + 1;
  size_t slots = s.free_seqs.size();
  for (const auto& a : s.queues.waiting) {
    if (slots-- == 0) break;
    pages += (std::min<int64_t>(static_cast<int64_t>(a->prompt.size()), config_.prefill_chunk) + bt) / bt;
  }
  // Running sequences that could not grow this pass were preempted, and count above.
  const int64_t short_by = pages - s.kv->free_blocks();
  return short_by > 0 ? static_cast<uint64_t>(pages) * s.kv->block_footprint() : 0;
}

engine::served* engine::plan_and_pick() {
  const auto now = clock_type::now();
  auto& arb = models_.front()->cfg.placement->arbiter();
  std::vector<model_facts> facts;
  for (const auto& m : models_) {
    model_facts f;
    f.name = m->cfg.name;
    f.running = static_cast<int>(m->queues.running.size());
    f.preempted = static_cast<int>(m->queues.preempted.size());
    f.queued = static_cast<int>(m->queues.waiting.size());
    // The oldest request waiting to start or to resume: its wait ages the model.
    for (const auto& a : m->queues.waiting)  // the front is not always the oldest (admission_plan.h)
      if (f.oldest == policy::time_point{} || a->arrived < f.oldest) f.oldest = a->arrived;
    for (const auto& a : m->queues.preempted)
      if (f.oldest == policy::time_point{} || a->arrived < f.oldest) f.oldest = a->arrived;
    f.last_used = m->last_pass;
    f.loaded_at = m->loaded_at;
    f.arrivals_per_s = m->arrivals.at(now);
    f.kv_floor_bytes = static_cast<uint64_t>(m->kv->floor_blocks()) * m->kv->block_footprint();
    f.kv_wanted_bytes = kv_wanted(*m);
    f.draft_speedup = m->draft_gain.load();
    facts.push_back(std::move(f));
  }
  const double link = config_.link_gb_s > 0                       ? config_.link_gb_s
                      : arb.device_backend().info().link_gbps > 0 ? arb.device_backend().info().link_gbps
                                                                  : 25.0;
  const auto snap_now = arb.snapshot();
  const auto snap = planner_snapshot(snap_now, arb.config().block_bytes, facts, link, 2.0);
  end_unplaceable(snap, facts);
  const auto plan = policy::make_plan(*roster_, snap, planner_demand(facts), now);
  for (const auto& act : plan.actions) {
    served* t = find(act.model);
    if (!t) continue;
    if (act.kind == policy::action_kind::preempt)
      preempt_all(*t);
    else if (act.kind != policy::action_kind::resume)
      carry_out(*t, act, snap_now);
  }
  finish_swap_ins();
  if (plan.run.empty()) return nullptr;
  served* s = find(plan.run);
  return s && runnable(arb.snapshot(), s->cfg.name) ? s : nullptr;
}

namespace {

const memory::model_snapshot* model_in(const memory::arbiter_snapshot& snap, const std::string& name) {
  for (const auto& m : snap.models)
    if (m.name == name) return &m;
  return nullptr;
}

}  // namespace

memory::status engine::carry_out(served& t, const policy::action& act, const memory::arbiter_snapshot& snap) {
  const auto now = clock_type::now();
  const auto* before = model_in(snap, t.cfg.name);
  uint64_t absent = 0, present = 0;  // weight bytes off and on the device before the action
  if (before)
    for (const auto& seg : before->segments) (seg.device == memory::residency::absent ? absent : present) += seg.bytes;
  const bool was_on = present > 0 || (before && before->stream_slots > 0);
  // A draft leaving the device takes its mirrors' KV with it: speculation stops until it is
  // back, and the targets' sequences go on as they are.
  if (act.kind == policy::action_kind::evict_device) drop_mirrors_in(t);
  auto st = apply_memory_action(*t.cfg.placement, act);
  if (st == memory::status::no_space && (act.kind == policy::action_kind::stage || act.kind == policy::action_kind::load)) {
    // Weights come before cached prefixes: give the host tier back and try again.
    int dropped = 0;
    for (auto& m : models_)
      if (m->cache) dropped += m->cache->drop_host(m->cache->host_blocks());
    if (dropped > 0) st = apply_memory_action(*t.cfg.placement, act);
  }
  if (act.kind == policy::action_kind::load && !was_on && st == memory::status::ok) {
    t.loaded_at = now;
    ++t.swaps.ins;
    t.swaps.in_bytes += absent;
    t.swaps.in_started = now;
  } else if (act.kind == policy::action_kind::evict_device && present > 0 && st == memory::status::ok) {
    // Its KV follows it: cached prefix blocks go to the host tier (or are dropped when that
    // has no room), to come back by copy when a request matches them again. (A fixed pool's
    // blocks free nothing for others: they stay.)
    if (t.cache && t.kv->elastic()) t.cache->evict(std::numeric_limits<int32_t>::max());
    ++t.swaps.outs;
    t.swaps.out_bytes += present;
    t.swaps.in_started.reset();
  }
  runtime::logger().debug("engine: {} {} ({}): {}", policy::action_name(act.kind), act.model, act.why, memory::status_name(st));
  return st;
}

void engine::finish_swap_ins() {
  if (std::none_of(models_.begin(), models_.end(), [](const auto& m) { return m->swaps.in_started.has_value(); })) return;
  const auto snap = models_.front()->cfg.placement->arbiter().snapshot();
  const auto now = clock_type::now();
  for (auto& m : models_) {
    if (!m->swaps.in_started) continue;
    const auto* ms = model_in(snap, m->cfg.name);
    if (ms && std::any_of(ms->segments.begin(), ms->segments.end(), [](const auto& seg) { return seg.device == memory::residency::in_flight; }))
      continue;
    const double secs = std::chrono::duration<double>(now - *m->swaps.in_started).count();
    m->swaps.last_in_seconds = secs;
    m->swaps.in_seconds += secs;
    m->swaps.in_started.reset();
  }
}

void engine::control(const std::string& model, const model_control& c) {
  known(model);
  if (!roster_) throw std::invalid_argument("engine: model '" + model + "' is not placed by a roster; it cannot be loaded, evicted or pinned");
  {
    std::lock_guard lock(m_);
    controls_.emplace_back(model, c);
  }
  cv_.notify_all();
}

void engine::apply_controls() {
  std::deque<std::pair<std::string, model_control>> later;
  while (!controls_.empty()) {
    auto [name, c] = std::move(controls_.front());
    controls_.pop_front();
    served& s = *find(name);
    auto entry = std::find_if(roster_->models.begin(), roster_->models.end(), [&](const auto& e) { return e.name == name; });
    if (c.priority) entry->priority = s.cfg.priority = *c.priority;
    if (c.pinned) entry->pinned = *c.pinned;
    if (c.keep_alive) entry->keep_alive = *c.keep_alive;
    auto& arb = s.cfg.placement->arbiter();
    if (c.evict && entry->pinned) {
      // Pinned models stay: an operator unpins first (the admin route answers 409).
      runtime::logger().warn("engine: not evicting '{}': it is pinned", name);
      c.evict = false;
    }
    if (c.evict) {
      preempt_all(s);  // resumed when the plan brings the model back for them
      // Busy: copies still landing, or a lease: try again shortly rather than forget it.
      if (carry_out(s, {policy::action_kind::evict_device, name, "operator", 0}, arb.snapshot()) == memory::status::busy)
        later.emplace_back(name, model_control{.evict = true});
    }
    if (c.load) {
      carry_out(s, {policy::action_kind::stage, name, "operator", 0}, arb.snapshot());
      carry_out(s, {policy::action_kind::load, name, "operator", 0}, arb.snapshot());
      s.last_pass = clock_type::now();  // the keep-alive clock starts now
    }
  }
  if (!later.empty()) {
    stalled_ = true;
    for (auto& l : later) controls_.push_back(std::move(l));
  }
}

model_stats engine::stats(const std::string& model) const {
  const served& s = known(model);
  std::lock_guard lock(m_);
  model_stats st;
  st.queued = static_cast<int>(s.queues.waiting.size());
  for (const auto& a : submitted_)
    if (models_[a->model].get() == &s) ++st.queued;
  st.running = static_cast<int>(s.queues.running.size());
  st.preempted = static_cast<int>(s.queues.preempted.size());
  st.kv_blocks_used = s.kv_in_use.load();
  st.kv_blocks_total = s.kv->total_blocks();
  st.kv_blocks_cached = s.kv_cached.load();
  st.kv_blocks_cached_host = s.kv_cached_host.load();
  st.kv_blocks_device = s.kv_device.load();
  st.kv_blocks_floor = s.kv->floor_blocks();
  st.kv_block_bytes = s.kv->block_footprint();
  st.kv_blocks_moved_to_host = s.kv_moved_to_host.load();
  st.kv_blocks_moved_to_device = s.kv_moved_to_device.load();
  st.priority = s.cfg.priority;
  if (roster_)
    if (const auto* e = roster_->find(model)) {
      st.pinned = e->pinned;
      st.keep_alive = e->keep_alive;
    }
  st.last_used = s.last_pass;
  st.prefix_queries = s.prefix_queries;
  st.prefix_hits = s.prefix_hits;
  st.preemptions = s.preemptions;
  st.interleaved_passes = s.interleave.passes;
  st.swap_ins = s.swaps.ins;
  st.swap_outs = s.swaps.outs;
  st.swap_in_bytes = s.swaps.in_bytes;
  st.swap_out_bytes = s.swaps.out_bytes;
  st.swap_in_seconds = s.swaps.in_seconds;
  st.last_swap_in_seconds = s.swaps.last_in_seconds;
  st.spec_proposed = s.spec_proposed.load();
  st.spec_accepted = s.spec_accepted.load();
  st.spec_passes = s.spec_passes.load();
  st.spec_tokens = s.spec_tokens.load();
  st.draft_seconds = static_cast<double>(s.draft_ns.load()) / 1e9;
  st.draft_speedup = s.draft_gain.load();
  if (s.draft) st.draft = s.draft->cfg.name;
  return st;
}

void engine::preempt_all(served& s) {
  // One at a time off the running list, so that a copy that throws leaves every sequence in
  // exactly one list for the error path to end.
  while (!s.queues.running.empty()) {
    auto a = s.queues.running.back();
    preempt(s, *a);
    a->preempt = false;
    ++preemptions_;
    ++s.preemptions;
    s.queues.running.pop_back();
    s.queues.preempted.push_front(std::move(a));
  }
  s.publish();
}

}  // namespace tandem::runtime
