#include "bench/stats.h"

#include <algorithm>
#include <vector>

namespace tandem::bench {

summary summarize(std::span<const double> samples) {
  summary s;
  if (samples.empty()) return s;
  // A copy: callers keep their samples in measurement order (the JSON lists them so).
  std::vector<double> v(samples.begin(), samples.end());
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  s.count = static_cast<int64_t>(n);
  s.min = v.front();
  s.max = v.back();
  s.median = n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  return s;
}

}  // namespace tandem::bench
