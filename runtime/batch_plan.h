// One pass's plan, formed over plain counts: which running sequences get rows (decode rows
// first, then prompt chunks under the ITL budget), the KV blocks that takes, and what must give
// way when the pool is short (prefix-cache blocks first, then the sequence admitted last that
// is not in this pass). No model, no pool: the engine fills a batch_state from its queues and
// its kv_pool, carries out the plan's evictions, preemptions and reservations on the real pool,
// then runs the pass (engine_batch.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace tandem::runtime {

// A running sequence, as the planner sees it.
struct batch_sequence {
  int64_t prompt_tokens = 0;  // its prompt (after a recompute preemption: prompt and generated)
  int64_t prefilled = 0;      // prompt tokens in the KV; decoding once it reaches prompt_tokens
  int64_t pos = 0;            // positions in the KV: a decode row writes position pos
  int32_t blocks_held = 0;    // KV blocks its table covers (the positions it may write)
  int32_t blocks_owned = 0;   // of those, blocks no one else holds: what preempting it frees
  int64_t draft = 0;          // decoding: tokens proposed to verify beside its decode row (speculation)
};

struct batch_state {
  std::vector<batch_sequence> running;  // in admission order: the last is the first victim
  int64_t max_rows = 0;                 // rows of one pass
  int64_t prefill_chunk = 1;            // prompt rows of one sequence per pass (chunked prompts)
  int64_t block_tokens = 16;            // positions per KV block
  int32_t free_blocks = 0;              // free in the pool
  int32_t cached_blocks = 0;            // prefix-cache blocks the pool could free (shared by no sequence)
  // Prompt rows of chunked prompts a pass beside decode rows may carry (itl_estimator).
  int64_t prompt_row_limit = std::numeric_limits<int64_t>::max();
  bool probe_due = false;  // a pass with decode and prompt rows would be the ITL estimator's probe
  // The model's weights are still landing (a swap-in): the copy sets the pace of the pass, so
  // a prompt takes as many rows as the pass holds instead of one chunk.
  bool swap_in = false;
};

// Rows of one sequence in the pass.
struct batch_entry {
  size_t seq = 0;       // index into batch_state::running
  int64_t first = 0;    // position of its first row (prompt: prefilled; decode: pos)
  int64_t rows = 0;     // 1 for a decode row; a prompt chunk's tokens
  bool prompt = false;  // prompt rows (its last gives logits only when it ends the prompt)
  bool whole = false;   // a short prompt that went in whole, outside the ITL budget
  int64_t draft = 0;    // decode: proposed tokens after the decode row (rows = 1 + draft)
};

struct batch_plan {
  // In pass order: every decode row, then prompt chunks. Empty: nothing can run.
  std::vector<batch_entry> entries;
  // Sequences to preempt before the pass (indices into running, in the order chosen); none of
  // them has rows. A sequence that could not get blocks even then is among them.
  std::vector<size_t> preempt;
  int32_t drop_cached = 0;  // prefix-cache blocks to release first
  // KV positions each entry's sequence must cover (first + rows), as entries: for kv_pool::reserve.
  std::vector<int64_t> reserve_tokens;
  int64_t decode_rows = 0, prompt_rows = 0, draft_rows = 0;
  bool mixed = false;  // sequences both decode and prefill: the ITL budget applies (and probes count)
  bool probe = false;  // a decode-only pass that measures decode cost (prompt chunks left out)
};

// What a pass carried out from a plan gives back: the logits of each entry's last row.
struct step_result {
  // entries.size() rows of `vocab` floats, in the plan's entry order; a prompt entry's row is
  // read only when the chunk ends its prompt. Valid until the model's next pass.
  std::span<const float> logits;
  size_t vocab = 0;
};

// Pure: the plan for the next pass of `s`. Decode rows first, one each; then the proposed
// tokens of decoding sequences (batch_sequence::draft), as rows and free blocks allow; then prompt chunks, in
// admission order, each at most prefill_chunk (or the whole pass during a swap-in) and all
// together at most prompt_row_limit while sequences decode. A prompt of at most prefill_chunk
// tokens goes in whole, outside that limit. When a sequence's rows need more blocks than are
// free, cached blocks go first, then the sequence admitted last that has no rows in this pass,
// and if none is left, the sequence itself (it then has no rows).
batch_plan plan_batch(const batch_state& s);

}  // namespace tandem::runtime
