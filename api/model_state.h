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
  // "device" (every segment), "loading" (copies landing), "partial" (some segments, the rest
  // streamed), "host" (staged in pinned RAM only), "disk" (only the mapped file).
  std::string state = "disk";
  bool runnable = false;  // a pass could run now
};

model_residency residency_of(const memory::arbiter_snapshot& snap, const std::string& model);

}  // namespace tandem::api
