// The planner's plain inputs and output: what is where (a snapshot of the arbiter, in models'
// terms), what is asked for (demand), and the ordered actions that should follow. The engine
// fills the inputs from the arbiter and its queues; `tandem sim` fills them from its virtual
// world. Times are on an injected clock, so every decision is reproducible.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

namespace tandem::policy {

using clock = std::chrono::steady_clock;
using time_point = clock::time_point;

struct model_state {
  std::string name;              // a roster entry's name
  uint64_t weight_bytes = 0;     // of its device form
  bool on_device = false;        // on the device (or landing), wholly or in part
  uint64_t device_bytes = 0;     // of the weights on the device; 0 with on_device: all of them
                                 // (the rest is streamed through stream slots each pass)
  bool on_host = false;          // a host copy of every segment (or landing)
  uint64_t kv_device_bytes = 0;  // KV its sequences hold on the device now
  // Device KV its waiting work needs and cannot get from the free device memory now: its
  // preempted sequences' pages back (and one more each), the first pages of requests it has
  // slots for. Room is made for it as for weights.
  uint64_t kv_wanted_bytes = 0;
  int running = 0;         // sequences being generated (their KV is on the device)
  int preempted = 0;       // sequences whose KV waits on the host
  time_point last_used{};  // last time a request of it ran
  time_point loaded_at{};  // when it last came onto the device
};

struct snapshot {
  uint64_t device_capacity = 0;
  uint64_t host_capacity = 0;
  uint64_t device_other = 0;  // device bytes no model holds (scratch)
  double link_gb_s = 25;      // measured host -> device copy speed
  double disk_gb_s = 2;       // measured disk -> host staging speed
  std::vector<model_state> models;
};

struct model_demand {
  std::string name;
  int queued = 0;             // requests waiting to start
  time_point oldest{};        // arrival of the oldest request waiting to start or to resume
                              // after preemption (time_point{}: none waits); its wait ages the model
  double arrivals_per_s = 0;  // recent arrival rate (for prefetching)
  // Speculation by its draft model, as measured: tokens a sequence gains per unit of time
  // (above 1 it pays for its draft's passes); 0: not measured yet.
  double draft_speedup = 0;
};

struct demand {
  std::vector<model_demand> models;
};

enum class action_kind {
  stage,         // disk -> host
  load,          // -> device (from host when staged)
  evict_device,  // free the device copy (a host copy stays if there is one)
  evict_host,    // free the host copy
  preempt,       // swap the model's running sequences' KV to host; they resume later
  resume,        // bring a model's preempted sequences' KV back
};

// Weight bytes of a model on the device (all of them for on_device with device_bytes 0).
inline uint64_t resident_bytes(const model_state& m) {
  if (!m.on_device) return 0;
  return m.device_bytes == 0 ? m.weight_bytes : m.device_bytes;
}

struct action {
  action_kind kind;
  std::string model;
  std::string why;     // for logs and the simulator
  uint64_t bytes = 0;  // load: weight bytes to hold on the device, the rest streamed; 0: all
};

struct plan {
  std::vector<action> actions;  // in order: preempt / evict first, then stage / load / resume
  std::string run;              // the model to step next ("" when nothing can run)
};

const char* action_name(action_kind k);

}  // namespace tandem::policy
