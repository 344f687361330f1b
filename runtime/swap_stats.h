// A model's weight swaps, as model_stats reports them: brought to the device (swap-ins) by the
// plan or an operator, taken off it (swap-outs). Written by the engine thread under engine::m_.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

namespace tandem::runtime {

struct swap_stats {
  int64_t ins = 0, outs = 0;
  uint64_t in_bytes = 0, out_bytes = 0;  // weight bytes that were off (ins) or on (outs) the device
  // A swap-in's seconds run from its start until every segment is resident.
  double in_seconds = 0, last_in_seconds = 0;
  std::optional<std::chrono::steady_clock::time_point> in_started;  // a swap-in whose segments are still landing
};

}  // namespace tandem::runtime
