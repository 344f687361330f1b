// A `tandem sim` trace: how long a simulated day lasts, what each model costs on the
// simulated box, the TTFT objectives, and where requests come from (explicit arrivals and
// seeded generators: Poisson streams and on/off bursts). `trace_loader.h` reads it from YAML;
// policy/sim.h expands and replays it.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "configs/duration.h"

namespace tandem::configs {

struct length_range {
  int64_t min = 1, max = 1;  // uniform over [min, max]
};

struct stream_spec {
  std::string model;
  bool bursts = false;    // false: Poisson at `rate`; true: on/off
  double rate_per_s = 0;  // Poisson rate, or the rate while on
  duration on{}, off{};   // bursts: lengths of the on and off periods (exponential means)
  length_range prompt, output;
  uint64_t seed = 0;  // offset from the trace seed, so streams differ
};

struct explicit_request {
  duration at{};
  std::string model;
  int64_t prompt = 0, output = 0;
};

struct model_costs {
  double prefill_tok_s = 1000;  // one sequence's prompt tokens per second
  double decode_tok_s = 30;     // one sequence's generated tokens per second
  double batch_gain = 0.9;      // a batch of n decodes takes (1 + (n - 1) * (1 - batch_gain)) steps' time
  int layers = 32;              // a pass's granularity: work of a higher-priority model may run between layers
};

struct trace_costs {
  double link_gb_s = 25;  // host -> device
  double disk_gb_s = 3;   // disk (page cache) -> host / device
  duration step_overhead{std::chrono::milliseconds(2)};
  duration process_start{std::chrono::milliseconds(200)};  // what a process-per-model server adds per load
  std::map<std::string, model_costs> models;
};

struct trace_spec {
  std::string source;
  duration length{std::chrono::hours(1)};
  uint64_t seed = 1;
  trace_costs costs;
  std::map<std::string, duration> slo_ttft;  // by model name
  std::vector<stream_spec> streams;
  std::vector<explicit_request> requests;
};

}  // namespace tandem::configs
