#include "runtime/itl_estimator.h"

#include <algorithm>
#include <limits>

namespace tandem::runtime {

void itl_estimator::learn(int64_t decode_rows, int64_t prompt_rows, double seconds) {
  // Moving averages: the costs drift as contexts grow (attention) and batches change.
  constexpr double k_weight = 0.25;
  auto blend = [](double old, double now) { return old <= 0 ? now : old + k_weight * (now - old); };
  if (decode_rows > 0 && prompt_rows == 0) {
    decode_pass_s = blend(decode_pass_s, seconds);
  } else if (decode_rows > 0 && prompt_rows > 0 && decode_pass_s > 0) {
    // A ratio of averages, not an average of ratios: a pass of one prompt row would otherwise
    // turn a millisecond of jitter into a millisecond per row, and shrink the next chunks.
    prompt_extra_s = blend(prompt_extra_s, seconds - decode_pass_s);
    prompt_rows_avg = blend(prompt_rows_avg, static_cast<double>(prompt_rows));
    prompt_row_s = std::max(prompt_extra_s, 1e-6 * prompt_rows_avg) / prompt_rows_avg;
  }
}

int64_t itl_estimator::prompt_row_limit(const itl_limits& l, int64_t chunk) const {
  if (l.unlimited()) return std::numeric_limits<int64_t>::max();
  // Until both costs are known, a small probe chunk measures them.
  if (decode_pass_s <= 0 || prompt_row_s <= 0) return std::min<int64_t>(chunk, 4);
  // The target bounds the streams' slowest gaps, not their mean: passes are filled to a share of
  // it, leaving room for jitter and for rows that cost more than the average (attention grows
  // along a prompt).
  const double budget_s = std::max(k_target_fill * l.target_s, std::max(l.ratio, 0.0) * decode_pass_s);
  const double rows = (budget_s - decode_pass_s) / prompt_row_s;
  // At least one row a pass: a prompt always advances, even when one row costs more than the budget.
  return rows >= 1 ? static_cast<int64_t>(std::min(rows, 1e15)) : 1;
}

}  // namespace tandem::runtime
