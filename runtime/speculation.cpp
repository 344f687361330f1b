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

void spec_window::learn(int64_t proposed, int64_t accepted, int64_t max) {
  if (proposed <= 0) return;
  const int64_t cur = next(max);
  // A full hit suggests the source runs on (a repeated block of code, a predicted answer);
  // a miss that the guess went wrong about where accepted ends.
  size = accepted >= proposed ? std::min(max, 2 * cur) : std::max<int64_t>(1, std::max(accepted + 1, cur / 2));
}

}  // namespace tandem::runtime
