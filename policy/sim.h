// `tandem sim`: a discrete-event simulator on a virtual clock that runs the planner (the same
// make_plan the server runs) against a cost model of one device: copies at link and disk
// speed, prefill and decode at each model's rates, a per-step overhead, and for the process-
// per-model baselines a process start per load. Pure code: the same trace, seed and roster
// give the same result, bit for bit.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "configs/roster.h"
#include "configs/trace.h"

namespace tandem::policy {

struct sim_request {
  double arrive = 0;  // seconds from the start
  std::string model;
  int64_t prompt = 0, output = 0;
};

// The trace's requests: explicit ones and those its generators draw with `seed` (the trace's
// own seed unless replaced), in arrival order.
std::vector<sim_request> expand_trace(const configs::trace_spec& t, uint64_t seed);

struct model_result {
  int requests = 0;
  int served = 0;                                            // got a first token before the simulation ended
  double ttft_p50_ms = 0, ttft_p95_ms = 0, ttft_p99_ms = 0;  // unserved requests count as infinitely late
  double e2e_p95_ms = 0;
  double slo_ttft_ms = 0;       // 0: no objective
  double slo_attainment = 1;    // share of requests with TTFT within the objective
  int swaps = 0;                // loads onto the device
  double gb_moved = 0;          // staged and loaded bytes
  std::vector<double> ttft_ms;  // every served request's, sorted (for the CDF plot)
};

struct sim_result {
  std::string policy;
  std::map<std::string, model_result> models;  // by model name
  double device_busy = 0;                      // share of the simulated time the device computed
  double end_s = 0;                            // when the last request finished
};

// Replays `requests` under the roster's policy.name. Models' sizes are the roster's stated
// (or file) sizes; their KV per token its kv_bytes_per_token.
sim_result simulate(const configs::roster& r, const configs::trace_spec& t, const std::vector<sim_request>& requests);

}  // namespace tandem::policy
