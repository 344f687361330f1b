#include "runtime/speculation.h"

#include <algorithm>
#include <cstddef>

namespace tandem::runtime {

int64_t lookup_proposals(std::span<const int32_t> corpus, std::span<const int32_t> context, int n_min, int n_max, int64_t prefer_from, int64_t max,
                         std::vector<int32_t>& out) {
  const auto len = static_cast<int64_t>(corpus.size());
  if (max <= 0 || n_min < 1) return -1;
  for (int64_t n = std::min<int64_t>(n_max, static_cast<int64_t>(context.size())); n >= n_min; --n) {
    const auto key = context.last(static_cast<size_t>(n));
    // Matches at p..p+n-1 with a token after them: p + n < len.
    int64_t preferred = -1, last = -1;
    for (int64_t p = 0; p + n < len; ++p) {
      if (corpus[static_cast<size_t>(p)] != key[0] || !std::equal(key.begin(), key.end(), corpus.begin() + p)) continue;
      last = p;
      if (p + n >= prefer_from) {
        preferred = p;
        break;
      }
    }
    const int64_t p = preferred >= 0 ? preferred : last;
    if (p < 0) continue;
    const int64_t from = p + n, to = std::min(len, from + max);
    out.insert(out.end(), corpus.begin() + from, corpus.begin() + to);
    return from;
  }
  return -1;
}

void ngram_cache::add(std::span<const int32_t> output) {
  // An output longer than the whole bound keeps its end (the most recent text).
  if (static_cast<int64_t>(output.size()) > max_tokens_) output = output.last(static_cast<size_t>(max_tokens_));
  if (output.size() < 2) return;  // nothing can follow a match in it
  outputs_.emplace_back(output.begin(), output.end());
  tokens_ += static_cast<int64_t>(output.size());
  while (tokens_ > max_tokens_) {
    tokens_ -= static_cast<int64_t>(outputs_.front().size());
    outputs_.pop_front();
  }
}

bool ngram_cache::lookup(std::span<const int32_t> context, int n_min, int n_max, int64_t max, std::vector<int32_t>& out) const {
  for (auto it = outputs_.rbegin(); it != outputs_.rend(); ++it)
    if (lookup_proposals(*it, context, n_min, n_max, std::numeric_limits<int64_t>::max(), max, out) >= 0) return true;
  return false;
}

void acceptance_record::add(int64_t proposed, int64_t accepted) {
  if (proposed <= 0) return;
  constexpr double k_decay = 0.8;
  hits = k_decay * hits + static_cast<double>(accepted);
  judged = k_decay * judged + static_cast<double>(accepted < proposed ? accepted + 1 : proposed);
}

int64_t best_draft_length(double acceptance, double cost_ratio, int64_t room) {
  const double a = std::clamp(acceptance, 0.0, 1.0);
  const double c = std::max(cost_ratio, 0.0);
  int64_t best = 0;
  double best_rate = 1.0;  // a plain pass: one token for one pass
  double tokens = 1.0, p = 1.0;
  for (int64_t k = 1; k <= room; ++k) {
    p *= a;  // the k-th guess is reached and accepted
    tokens += p;
    const double rate = tokens / (1.0 + c * static_cast<double>(k));
    if (rate > best_rate * (1 + 1e-9)) {
      best_rate = rate;
      best = k;
    }
  }
  return best;
}

void spec_window::learn(int64_t proposed, int64_t accepted, int64_t max) {
  if (proposed <= 0) return;
  passes_idle = 0;
  record.add(proposed, accepted);
  const int64_t cur = next(max);
  // A full hit suggests the source runs on (a repeated block of code, a predicted answer):
  // ramping back up one doubling a pass cost two or three short passes a run in `bench spec`.
  // A miss says the guess went wrong about where accepted ends.
  size = accepted >= proposed ? max : std::max<int64_t>(1, std::max(accepted + 1, cur / 2));
}

}  // namespace tandem::runtime
