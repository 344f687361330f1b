// The behaviours users compare tandem with, as planners over the same inputs, so `tandem sim`
// replays one trace under each (facts from ../shared/reference/multi-model-prior-art.md):
//  - exclusive: one model on the device at a time, swapped on demand, first come first
//    served, reloaded from disk (llama-swap restarts a process per swap);
//  - lru-keepalive: no priorities; a requested model must fit whole beside the others, idle
//    models leave by shortest keep_alive, then least recently used; reloads from disk
//    (Ollama's scheduler);
//  - static: a fixed partition chosen once by priority, never swapped; models outside it are
//    not served (a fixed split of the GPU between servers).
#pragma once

#include "configs/roster.h"
#include "policy/plan_types.h"

namespace tandem::policy {

plan plan_exclusive(const configs::roster& r, const snapshot& s, const demand& d, time_point now);
plan plan_lru_keepalive(const configs::roster& r, const snapshot& s, const demand& d, time_point now);
plan plan_static(const configs::roster& r, const snapshot& s, const demand& d, time_point now);

}  // namespace tandem::policy
