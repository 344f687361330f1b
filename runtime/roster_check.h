// The placement checks `tandem serve` makes before it allocates anything, in one place, so
// that `tandem serve --check` (model files present or not) refuses a roster with the same
// message serve would: a kv_limit below one KV page, KV floors and pinned or preloaded weights
// beyond the device budget, a model that could not run even with the device to itself.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "configs/roster.h"
#include "models/model.h"

namespace tandem::runtime {

// What one roster model asks of the device.
struct model_needs {
  const configs::model_entry* entry = nullptr;
  uint64_t weight_bytes = 0;     // its segments' device form (file bytes when only stated)
  uint64_t largest_segment = 0;  // a stream slot's size (the whole model when only stated)
  uint64_t kv_bytes_per_token = 0;
  bool from_file = false;
};

// From the model as serve opened it, or (m null) the sizes the roster states (the loader has
// made sure they are there).
model_needs needs_of(const configs::model_entry& e, const models::model* m, kernels::cpu::kv_type kv);

// The arbiter allocation unit serve uses for these models (kv_page_unit of their KV blocks).
size_t page_unit_of(std::span<const model_needs> needs);

// Throws std::runtime_error, naming the model and its line and the sizes, for what serve
// would refuse. unit: the arbiter's allocation unit (page_unit_of).
void check_placement(const configs::roster& r, std::span<const model_needs> needs, size_t unit);

// The KV pages model i can hold on the device at most: with all its weights resident beside
// the pinned models' weights and every other model's floor (kv_reserve), within its own limit.
// Its longest context is this times k_kv_block_tokens positions (for one sequence, up to its
// `context`). 0 when its weights do not fit so (it then streams them).
int32_t kv_pages_beside_weights(const configs::roster& r, std::span<const model_needs> needs, size_t unit, size_t i);

}  // namespace tandem::runtime
