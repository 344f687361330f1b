#include "runtime/admission_plan.h"

#include <algorithm>

namespace tandem::runtime {

admission_plan plan_admission(const admission_state& s) {
  admission_plan plan;
  int32_t free = s.free_blocks, cached = s.cached_blocks;
  int running = s.running;
  auto make_room = [&](int32_t want) {
    if (free >= want || cached <= 0) return;
    const int32_t d = std::min(cached, want - free);
    cached -= d;
    free += d;
    plan.drop_cached += d;
  };
  for (const int32_t need : s.preempted_blocks) {
    const int32_t want = need + running;  // headroom of a block per running sequence
    make_room(want);
    if ((free < want && running > 0) || free < need) break;
    free -= need;
    ++running;
    ++plan.resume;
  }
  if (plan.resume < s.preempted_blocks.size()) return plan;  // they were first

  const int64_t bt = s.block_tokens;
  std::vector<size_t> order(s.waiting.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  for (int slots = s.free_slots; slots > 0 && !order.empty(); --slots) {
    // When the pool cannot hold the next request's first chunk, a request a little further
    // back whose prompt starts with more cached blocks goes first: it needs fewer new blocks,
    // and its cached ones would otherwise be the next to leave the device. Not past a request
    // that has waited long: a stream of requests sharing a prompt must not starve one that
    // shares nothing.
    const auto& front = s.waiting[order.front()];
    const int64_t front_first = std::min(front.prompt_tokens, s.prefill_chunk);
    if (!front.waited_long && free < (front_first + bt - 1) / bt) {
      size_t best = 0;
      for (size_t k = 1; k < std::min(order.size(), k_admission_lookahead); ++k)
        if (s.waiting[order[k]].cached_blocks > s.waiting[order[best]].cached_blocks) best = k;
      std::rotate(order.begin(), order.begin() + static_cast<long>(best), order.begin() + static_cast<long>(best) + 1);
    }
    const auto& w = s.waiting[order.front()];
    // Its cached prefix is adopted (shared from then on, so no longer free to release), and
    // its first chunk past the prefix needs new blocks.
    const int64_t start = w.cached_blocks * bt;
    const int64_t first = start + std::min(w.prompt_tokens - start, s.prefill_chunk);
    const auto need = static_cast<int32_t>((first + bt - 1) / bt) - w.cached_blocks;
    cached -= std::min(cached, w.cached_blocks);
    make_room(need);
    if (free < need) break;
    free -= need;
    plan.admit.push_back(order.front());
    order.erase(order.begin());
  }
  return plan;
}

}  // namespace tandem::runtime
