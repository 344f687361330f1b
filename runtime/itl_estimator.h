// How many prompt rows a pass may carry beside decoding streams: the engine measures, as it
// runs, what a pass of decode rows alone costs and what one prompt row adds beside them, and
// sizes prompt chunks to a per-pass budget (itl_limits). Plain data; no clock of its own (the
// engine passes each pass's measured seconds).
#pragma once

#include <cstdint>

namespace tandem::runtime {

// The per-pass time budget while sequences decode: max(target_s, ratio x a decode pass alone),
// the target taken as a bound on the streams' slowest gaps (passes are filled to
// itl_estimator::k_target_fill of it). The target keeps a long prompt moving where decode
// passes are cheap (prompt rows fill each pass up to it); the ratio bounds the streams'
// slowdown where a decode pass alone already takes the target or more. Either may be 0 (off);
// both 0: prompt chunks whatever they cost.
struct itl_limits {
  double ratio = 2.0;      // times a pass of decode rows alone (engine_config::itl_budget)
  double target_s = 0.05;  // seconds of one pass (engine_config::itl_target)
  bool unlimited() const { return ratio <= 0 && target_s <= 0; }
};

struct itl_estimator {
  // Moving averages, 0 until measured: seconds of a pass of decode rows only; the extra
  // seconds of the prompt rows of a mixed pass and their count (prompt_row_s is their ratio).
  double decode_pass_s = 0;
  double prompt_row_s = 0;
  double prompt_extra_s = 0, prompt_rows_avg = 0;
  int64_t passes_with_prompts = 0;  // mixed passes formed so far: every k_probe_every-th is a probe

  // Every few mixed passes, one of decode rows alone: keeps decode_pass_s current as the
  // streams' contexts grow (the budget is relative to it).
  static constexpr int64_t k_probe_every = 8;
  // Share of itl_limits::target_s the planned passes take on average: on a 2-core machine,
  // passes planned to the whole 50 ms target gave the streams a p99 gap of 49-54 ms.
  static constexpr double k_target_fill = 0.8;

  // A pass of `decode_rows` and `prompt_rows` took `seconds` (other models' interleaved passes
  // not counted). Passes without decode rows teach nothing: the budget applies beside streams.
  void learn(int64_t decode_rows, int64_t prompt_rows, double seconds);
  // Prompt rows (of chunked prompts) a pass beside decoding streams may carry under `l`: at
  // least 1, so a prompt always advances; a small probe of 4 (at most `chunk`) until both
  // costs are known; INT64_MAX when `l` is unlimited.
  int64_t prompt_row_limit(const itl_limits& l, int64_t chunk) const;
  // Whether the next mixed pass (decode and prompt rows) should be a decode-only probe: true
  // for the k_probe_every-th of the mixed passes counted by passes_with_prompts.
  bool probe_next() const { return (passes_with_prompts + 1) % k_probe_every == 0; }
};

}  // namespace tandem::runtime
