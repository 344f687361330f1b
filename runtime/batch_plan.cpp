#include "runtime/batch_plan.h"

#include <algorithm>

namespace tandem::runtime {

batch_plan plan_batch(const batch_state& s) {
  batch_plan plan;
  const size_t n = s.running.size();
  std::vector<char> in_pass(n, 0), gone(n, 0);  // gone: chosen for preemption
  int32_t free = s.free_blocks, cached = s.cached_blocks;
  int64_t rows_left = s.max_rows;

  // Blocks for `tokens` positions of sequence i. When the pool is short, cached blocks go
  // before anyone's running work does; then the sequence admitted last that has no rows in
  // this pass; then i itself (false: it has no rows).
  auto blocks_for = [&](size_t i, int64_t tokens) {
    const auto need = static_cast<int32_t>((tokens + s.block_tokens - 1) / s.block_tokens) - s.running[i].blocks_held;
    if (need <= 0) return true;
    if (free < need && cached > 0) {
      const int32_t d = std::min(cached, need - free);
      cached -= d;
      free += d;
      plan.drop_cached += d;
    }
    while (free < need) {
      size_t victim = n;
      for (size_t v = n; v-- > 0 && victim == n;)
        if (v != i && !gone[v] && !in_pass[v]) victim = v;
      const size_t out = victim == n ? i : victim;
      gone[out] = 1;
      plan.preempt.push_back(out);
      free += s.running[out].blocks_owned;
      if (out == i) return false;
    }
    free -= need;
    return true;
  };

  bool decoding = false, prefilling = false;
  for (const auto& q : s.running) (q.prefilled >= q.prompt_tokens ? decoding : prefilling) = true;
  // While sequences decode, the prompt rows of a pass are held to what fits the ITL budget;
  // with none decoding, a prompt takes whole chunks. A short prompt (one chunk at most) goes in
  // whole whatever the budget: the budget keeps a long prefill from stalling the streams, but
  // holding a burst of short requests to a row or two a pass would keep them waiting for
  // hundreds of passes (and out of the batch) to spare the streams a few milliseconds once.
  plan.mixed = decoding && prefilling;
  plan.probe = plan.mixed && s.probe_due;
  int64_t prompt_budget = !plan.mixed ? std::numeric_limits<int64_t>::max() : plan.probe ? 0 : s.prompt_row_limit;
  const int64_t chunk_cap = s.swap_in ? s.max_rows : s.prefill_chunk;

  // Proposed tokens of the decoding sequences (speculation), after every decode row is in:
  // as many as the rows left and the free blocks hold. They never make anyone give way, cached
  // blocks included: a proposal is worth less than any sequence's progress.
  const auto add_drafts = [&] {
    for (size_t k = 0; k < plan.entries.size() && rows_left > 0; ++k) {
      batch_entry& e = plan.entries[k];
      const batch_sequence& q = s.running[e.seq];
      if (e.prompt || q.draft <= 0) continue;
      int64_t extra = std::min(q.draft, rows_left);
      const auto blocks = [&](int64_t end) { return std::max<int64_t>(0, (end + s.block_tokens - 1) / s.block_tokens - q.blocks_held); };
      const int64_t taken = blocks(e.first + 1);  // the decode row's own, already counted
      while (extra > 0 && blocks(e.first + 1 + extra) - taken > free) --extra;
      if (extra <= 0) continue;
      free -= static_cast<int32_t>(blocks(e.first + 1 + extra) - taken);
      e.draft = extra;
      e.rows += extra;
      plan.draft_rows += extra;
      rows_left -= extra;
      plan.reserve_tokens[k] = e.first + e.rows;
    }
  };

  // Decoding sequences first, one row each, so that no prompt chunk crowds them out of a pass.
  for (const bool prompts : {false, true}) {
    if (prompts) add_drafts();
    for (size_t i = 0; i < n && rows_left > 0; ++i) {
      const batch_sequence& q = s.running[i];
      if (gone[i] || in_pass[i] || (q.prefilled < q.prompt_tokens) != prompts) continue;
      batch_entry e{.seq = i, .prompt = prompts};
      if (prompts) {
        const int64_t left = q.prompt_tokens - q.prefilled;
        e.whole = !plan.probe && q.prompt_tokens <= s.prefill_chunk && left <= rows_left;
        if (prompt_budget <= 0 && !e.whole) continue;
        e.first = q.prefilled;
        e.rows = e.whole ? left : std::min({chunk_cap, left, rows_left, prompt_budget});
      } else {
        e.first = q.pos;
        e.rows = 1;
      }
      if (!blocks_for(i, e.first + e.rows)) continue;
      if (prompts && !e.whole) prompt_budget -= e.rows;
      (prompts ? plan.prompt_rows : plan.decode_rows) += e.rows;
      rows_left -= e.rows;
      in_pass[i] = 1;
      plan.reserve_tokens.push_back(e.first + e.rows);
      plan.entries.push_back(e);
    }
  }
  return plan;
}

}  // namespace tandem::runtime
