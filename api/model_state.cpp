#include "api/model_state.h"

#include "runtime/memory_plan.h"

namespace tandem::api {

model_residency residency_of(const memory::arbiter_snapshot& snap, const std::string& model) {
  model_residency r;
  for (const auto& o : snap.owners)
    if (o.who.kind == memory::owner_kind::kv && o.who.model == model) {
      r.kv_device_bytes += o.device;
      r.kv_host_bytes += o.host;
    }
  for (const auto& m : snap.models) {
    if (m.name != model) continue;
    r.stream_slots = m.stream_slots;
    bool all_host = !m.segments.empty();
    for (const auto& s : m.segments) {
      ++r.segments;
      r.weight_bytes += s.bytes;
      r.leases += s.leases;
      if (s.device != memory::residency::absent) {
        r.device_bytes += s.bytes;
        ++r.on_device;
        if (s.device == memory::residency::in_flight) ++r.landing;
      }
      if (s.host != memory::residency::absent)
        r.host_bytes += s.bytes;
      else
        all_host = false;
    }
    if (r.landing > 0)
      r.state = "loading";
    else if (r.segments > 0 && r.on_device == r.segments)
      r.state = "device";
    else if (r.on_device > 0 || r.stream_slots > 0)
      r.state = "partial";
    else if (all_host)
      r.state = "host";
    r.runnable = runtime::runnable(snap, model);
  }
  return r;
}

double kv_usage_ratio(const memory::arbiter_snapshot& snap) {
  uint64_t kv = 0;
  for (const auto& o : snap.owners)
    if (o.who.kind == memory::owner_kind::kv) kv += o.device;
  const uint64_t free = snap.device.capacity > snap.device.used ? snap.device.capacity - snap.device.used : 0;
  return kv + free == 0 ? 1.0 : static_cast<double>(kv) / static_cast<double>(kv + free);
}

}  // namespace tandem::api
