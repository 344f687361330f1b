// The engine's side of the planner (policy/planner.h): the arbiter's snapshot and the engine's
// queues put in the planner's plain terms, and the plan's memory actions carried out on the
// arbiter. Preempting and resuming sequences is the engine's own business (engine.cpp); the
// rest (stage, load, evict) happens here, asynchronously: a load returns as soon as its copies
// are queued, and the forward pass waits per segment, so the first layers compute while the
// last ones land.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "memory/arbiter.h"
#include "models/arbiter_residency.h"
#include "policy/plan_types.h"

namespace tandem::runtime {

// What the engine knows of one model beside the arbiter.
struct model_facts {
  std::string name;  // as registered with the arbiter
  int running = 0;
  int preempted = 0;
  int queued = 0;
  policy::time_point oldest{};     // arrival of the oldest queued request
  policy::time_point last_used{};  // last pass
  policy::time_point loaded_at{};  // last load the engine started
  double arrivals_per_s = 0;
  uint64_t kv_floor_bytes = 0;   // device KV its pool keeps whatever happens (kv_reserve)
  uint64_t kv_wanted_bytes = 0;  // policy::model_state::kv_wanted_bytes
  double draft_speedup = 0;      // policy::model_demand::draft_speedup
};

// The planner's snapshot: capacities, the device bytes no model holds or can give back
// (scratch, KV floors), and per model its weights' residency, a streamed model's stream slots
// counted as its own device bytes (it is on the device in part), and its device KV pages above
// its floor (owner {kv, model}: sequences' and cached prefixes' blocks, which leave with it).
// Models unknown to the arbiter are left out. Sizes count whole arbiter blocks, as the pools do.
policy::snapshot planner_snapshot(const memory::arbiter_snapshot& a, size_t block_bytes, std::span<const model_facts> facts, double link_gb_s,
                                  double disk_gb_s);
policy::demand planner_demand(std::span<const model_facts> facts);

// Carries out a stage, load or evict action on one model; other kinds are the engine's and
// return ok untouched. A load of `bytes` (0: all) brings segments in order while they fit in
// that much and in the device tier, and reserves stream slots for the rest; ok when the model
// can run (every segment on the device, or slots to stream the missing ones through). An
// eviction from the device returns the stream slots too. Returns the arbiter's status.
memory::status apply_memory_action(models::arbiter_residency& r, const policy::action& a);

// Whether a forward pass of the model can run now: every segment on the device (or landing),
// or stream slots reserved for the ones that are not.
bool runnable(const memory::arbiter_snapshot& a, const std::string& model);

// Whether every segment of the model's weights has landed on the device (none absent or in
// flight): a pass of it needs no lease to wait and no stream slot.
bool all_resident(const memory::arbiter_snapshot& a, const std::string& model);

}  // namespace tandem::runtime
