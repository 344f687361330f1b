// The planner: roster + snapshot + demand + now -> plan. Pure and deterministic: no threads,
// I/O, clocks or logging; the same inputs give the same plan, in the server and in `tandem
// sim`. The roster's policy.name picks the rules: `tandem` (below), or one of the baselines
// users compare us with (baselines.h).
//
// tandem's rules, in the order they are applied:
//  1. Pinned models stay on the device: one that is not there is loaded first, evicting (and
//     if need be preempting) anything else.
//  2. Demanded models (queued requests or preempted sequences), highest effective priority
//     first, are brought onto the device: idle models of lower effective priority are evicted
//     by a cost-aware score (cheapest to bring back per byte freed, lowest priority, longest
//     idle first); if that is not enough, running sequences of lower-priority models are
//     preempted (their KV goes to host, they resume later) and those models evicted.
//  3. Effective priority ages: a model's waiting request gains priority with its wait, so
//     that after policy.max_wait it outranks every model of the roster (a bounded wait under
//     sustained high-priority load). Only work the model could start ages: a preempted
//     sequence, or a queued request while it has a free sequence slot.
//  2b. A demanded model that cannot have the whole device without taking it from models that
//     rank higher runs in part: as much of it as fits beside them, the rest streamed through
//     the link every pass (policy.stream); the rest comes on once room can be made.
// Requests waiting for their first token are stepped before generations already running.
//     An idle model of the same or higher priority gives way too, once it has been idle for
//     policy.idle_grace (between its bursts, not within one).
//  4. Hysteresis: a model that came onto the device less than policy.hysteresis ago is not
//     evicted for a model of the same or lower base priority, so alternating requests do not
//     ping-pong the device.
//  2c. Drafts: a target wholly on the device with work brings its draft (speculate.method
//     draft) where the free device memory holds it beside the target's wanted KV, unless its
//     measured speed-up (model_demand::draft_speedup) is below 1.05; then the draft leaves.
//     A draft without requests of its own is the first victim of every make-room: its
//     target goes on without speculation.
//  5. Keep-alive: an idle model whose keep_alive has run out leaves the device (0: as soon as
//     it is idle; -1: never).
//  6. Home: when nothing but the home model is asked for and the others have been idle for
//     the hysteresis, the home model comes back to the device.
//  7. Prefetch: when nothing is asked for, the model most likely to be asked for next is
//     staged to host, and loaded where the device has room without evicting anything.
//  8. Preempted sequences resume when their model is on the device and their KV fits.
// The model to run next is the demanded model on the device with the highest effective
// priority.
#pragma once

#include "configs/roster.h"
#include "policy/plan_types.h"

namespace tandem::policy {

plan make_plan(const configs::roster& r, const snapshot& s, const demand& d, time_point now);

// The rules of policy.name = "tandem" (make_plan dispatches on the name).
plan plan_tandem(const configs::roster& r, const snapshot& s, const demand& d, time_point now);

// Effective priority of a model with this demand at `now` (rule 3).
double effective_priority(const configs::roster& r, const configs::model_entry& m, const model_demand* d, time_point now);

// Whether work of `inner` may run between the layers of a pass of `outer` that has been
// paused for `paused` already: tandem policy with policy.interleave, `inner` of higher base
// priority, and the pause still within policy.max_wait (the outer pass's own requests age
// like any others). The caller checks that `inner` needs no memory action (all its weights
// on the device): a pass in flight holds its leases, so nothing may be planned meanwhile.
bool may_interleave(const configs::roster& r, const configs::model_entry& outer, const configs::model_entry& inner, std::chrono::nanoseconds paused);

// Eviction score of an idle model: lower is evicted first (rule 2).
double victim_score(const configs::model_entry& m, const model_state& st, const snapshot& s, time_point now);

}  // namespace tandem::policy
