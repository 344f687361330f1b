// A served model's requests by where they stand: waiting to start, running (holding a sequence
// slot and KV), or preempted (out of KV: swapped to host, or to be evaluated again). Each
// request is in exactly one list; the engine thread moves them, under engine::m_.
#pragma once

#include <cstddef>
#include <deque>
#include <vector>

namespace tandem::runtime {

template <class request_ptr>
struct request_queues {
  std::deque<request_ptr> waiting;    // in arrival order (admission may take one a little further back)
  std::vector<request_ptr> running;   // in admission order: the last admitted is the first victim
  std::deque<request_ptr> preempted;  // oldest first: they come back in this order, before anyone waits

  bool idle() const { return waiting.empty() && running.empty() && preempted.empty(); }
  size_t size() const { return waiting.size() + running.size() + preempted.size(); }
};

}  // namespace tandem::runtime
