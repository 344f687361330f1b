// Where a served model's weights are, from one arbiter snapshot: what /v1/models,
// /api/ps, /admin/models and /metrics report.
#pragma once

#include <cstdint>
#include <string>

#include "memory/arbiter.h"

namespace tandem::api {

struct model_residency {
  uint64_t weight_bytes = 0;  // all segments
  uint64_t device_bytes = 0;  // segments with a device copy (landing included)
  uint64_t host_bytes = 0;    // segments with a host copy
  int segments = 0, on_device = 0, landing = 0, leases = 0, stream_slots = 0;
  // KV the arbiter holds for it (owner {kv, model}): pages on the device, and on the host its
  // swapped-out sequences and spilled prefix blocks.
  uint64_t kv_device_bytes = 0, kv_host_bytes = 0;
  // "device" (every segment), "loading" (copies landing), "partial" (some segments, the rest
  // streamed), "host" (staged in pinned RAM only), "disk" (only the mapped file).
  std::string state = "disk";
  bool runnable = false;  // a pass could run now
};

model_residency residency_of(const memory::arbiter_snapshot& snap, const std::string& model);

// Of the device memory KV could have (the KV pages held, and the free bytes any model's pages
// could take), the share that KV holds: 0 .. 1 (the KV-utilisation signal of the Gateway API
// inference extension's model-server protocol).
double kv_usage_ratio(const memory::arbiter_snapshot& snap);

}  // namespace tandem::api
