// Which sequences join the running set before a pass, planned over plain counts: preempted
// sequences come back first (oldest first, each only with a block of headroom per running
// sequence, or it would be the next victim), and only once none is left do waiting requests
// start, in queue order except that, when the pool is tight, one a little further back whose
// prompt starts with cached blocks goes first. Prefix-cache blocks are released for either.
// The engine carries the plan out on its kv_pool and prefix cache, which have the last word:
// it stops at the first sequence the real pool cannot take (engine.cpp, engine::admit).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace tandem::runtime {

struct admission_state {
  // Per preempted sequence, oldest first: the device blocks it needs to come back (a swapped-out
  // one its whole KV; one to evaluate again its first prompt chunk).
  std::vector<int32_t> preempted_blocks;
  // Waiting requests in queue order (the engine may pass only the first few).
  struct waiting_request {
    int64_t prompt_tokens = 0;
    int32_t cached_blocks = 0;  // leading whole blocks of its prompt the prefix cache holds
    bool waited_long = false;   // past the patience after which nothing is preferred over it
  };
  std::vector<waiting_request> waiting;
  int running = 0;            // sequences running now
  int free_slots = 0;         // sequence slots a waiting request may take
  int32_t free_blocks = 0;    // free in the pool
  int32_t cached_blocks = 0;  // prefix-cache blocks the pool could free (shared by no sequence)
  int64_t block_tokens = 16;
  int64_t prefill_chunk = 1;  // a new sequence reserves its first chunk's blocks
};

struct admission_plan {
  size_t resume = 0;          // preempted sequences that come back, from the front
  std::vector<size_t> admit;  // waiting requests that start (indices into waiting), in this order
  int32_t drop_cached = 0;    // prefix-cache blocks released for them (before the last of them)
};

// Looked this far down the queue for a request whose prompt starts with cached blocks.
constexpr size_t k_admission_lookahead = 8;

// Pure: the plan for `s`. No waiting request starts while a preempted sequence stays out.
admission_plan plan_admission(const admission_state& s);

}  // namespace tandem::runtime
