#include "runtime/memory_plan.h"

#include <algorithm>

namespace tandem::runtime {

namespace {

uint64_t whole_blocks(uint64_t bytes, size_t block) { return (bytes + block - 1) / block * block; }

const memory::model_snapshot* find_model(const memory::arbiter_snapshot& a, const std::string& name) {
  for (const auto& m : a.models)
    if (m.name == name) return &m;
  return nullptr;
}

}  // namespace

policy::snapshot planner_snapshot(const memory::arbiter_snapshot& a, size_t block_bytes, std::span<const model_facts> facts, double link_gb_s,
                                  double disk_gb_s) {
  policy::snapshot s;
  s.device_capacity = a.device.capacity;
  s.host_capacity = a.host.capacity;
  s.link_gb_s = link_gb_s;
  s.disk_gb_s = disk_gb_s;
  uint64_t weights_on_device = 0, kv_movable = 0;
  for (const auto& f : facts) {
    const auto* m = find_model(a, f.name);
    if (!m) continue;
    policy::model_state st;
    st.name = f.name;
    bool all_host = !m->segments.empty();
    uint64_t largest = 0;
    for (const auto& seg : m->segments) {
      const uint64_t b = whole_blocks(seg.bytes, block_bytes);
      st.weight_bytes += b;
      largest = std::max(largest, b);
      if (seg.device != memory::residency::absent) st.device_bytes += b;
      all_host = all_host && seg.host != memory::residency::absent;
    }
    const bool all_on = st.device_bytes == st.weight_bytes;
    // A streamed model's slots are its own device bytes: they go when it is evicted, and with
    // them it runs even when no segment of its own is on the device (it is on the device in
    // part, which asks the planner to bring the rest when room can be made).
    if (!all_on && m->stream_slots > 0)
      st.device_bytes = std::min(st.device_bytes + static_cast<uint64_t>(m->stream_slots) * largest, st.weight_bytes - 1);
    weights_on_device += st.device_bytes;
    st.on_device = st.device_bytes > 0;
    if (all_on) st.device_bytes = 0;  // the planner's "all of it"
    st.on_host = all_host;
    // KV pages come and go with the model's sequences and cached prefixes (an eviction takes
    // them to the host tier); the floor stays, like scratch.
    uint64_t kv = 0;
    for (const auto& o : a.owners)
      if (o.who.kind == memory::owner_kind::kv && o.who.model == f.name) kv += o.device;
    st.kv_device_bytes = kv > f.kv_floor_bytes ? kv - f.kv_floor_bytes : 0;
    kv_movable += st.kv_device_bytes;
    st.kv_wanted_bytes = f.kv_wanted_bytes;
    st.running = f.running;
    st.preempted = f.preempted;
    st.last_used = f.last_used;
    st.loaded_at = f.loaded_at;
    s.models.push_back(std::move(st));
  }
  const uint64_t counted = weights_on_device + kv_movable;
  s.device_other = a.device.used > counted ? a.device.used - counted : 0;
  return s;
}

policy::demand planner_demand(std::span<const model_facts> facts) {
  policy::demand d;
  for (const auto& f : facts) d.models.push_back({f.name, f.queued, f.oldest, f.arrivals_per_s, f.draft_speedup});
  return d;
}

bool runnable(const memory::arbiter_snapshot& a, const std::string& model) {
  const auto* m = find_model(a, model);
  if (!m) return false;
  if (m->stream_slots > 0) return true;
  return std::all_of(m->segments.begin(), m->segments.end(), [](const auto& s) { return s.device != memory::residency::absent; });
}

bool all_resident(const memory::arbiter_snapshot& a, const std::string& model) {
  const auto* m = find_model(a, model);
  return m && std::all_of(m->segments.begin(), m->segments.end(), [](const auto& s) { return s.device == memory::residency::resident; });
}

memory::status apply_memory_action(models::arbiter_residency& r, const policy::action& act) {
  auto& a = r.arbiter();
  const auto id = r.id();
  switch (act.kind) {
    case policy::action_kind::stage:
      return a.stage(id).st;
    case policy::action_kind::evict_host:
      return a.evict(id, memory::tier::host);
    case policy::action_kind::evict_device: {
      const auto st = a.reserve_stream_slots(id, 0);
      if (st != memory::status::ok) return st;
      return a.evict(id, memory::tier::device);
    }
    case policy::action_kind::load: {
      // All of it in one go when it fits (and the stream slots, no longer needed, go back; a
      // slot still filling stays until a later load finds it idle: it costs room, not
      // correctness).
      if (act.bytes == 0 && a.load(id).st == memory::status::ok) {
        (void)a.reserve_stream_slots(id, 0);
        return memory::status::ok;
      }
      // In part: the stream slots first, so that the segments loaded leave room for them, then
      // segments in order, each alone, while they fit the plan's bytes and the device.
      if (const auto st = r.prepare_streaming(); st != memory::status::ok) return st;
      const size_t block = a.config().block_bytes;
      uint64_t taken = 0;
      for (int seg = 0; seg < a.segment_count(id); ++seg) {
        const uint64_t b = whole_blocks(a.segment_bytes(id, seg), block);
        if (a.residency_of(id, seg, memory::tier::device) != memory::residency::absent) {
          taken += b;
          continue;
        }
        if (act.bytes > 0 && taken + b > act.bytes) break;
        if (a.load(id, {seg, 1}).st != memory::status::ok) break;
        taken += b;
      }
      return memory::status::ok;
    }
    case policy::action_kind::preempt:
    case policy::action_kind::resume:
      return memory::status::ok;
  }
  return memory::status::ok;
}

}  // namespace tandem::runtime
