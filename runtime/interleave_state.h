// Interleaving as one model's pass sees it (engine_interleave.cpp): other models' passes run
// at its yield points (forward_pass::advance), between its layers. Reset at the start of each
// of its passes, except the count.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>

namespace tandem::runtime {

struct interleave_state {
  bool allowed = false;  // this pass yields to other models (not itself one run inside another)
  // When other models' passes first ran between this pass's layers: the paused pass's wait.
  std::optional<std::chrono::steady_clock::time_point> paused_since;
  double seconds = 0;   // their seconds, not counted in this pass's learned cost
  bool failed = false;  // an interleaved admission threw: none more in this pass
  int64_t passes = 0;   // passes of this model run inside another's (engine::m_; model_stats)

  void start_pass(bool allow) {
    allowed = allow;
    paused_since.reset();
    seconds = 0;
    failed = false;
  }
};

}  // namespace tandem::runtime
