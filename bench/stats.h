// Summaries of repeated measurements: benchmarks report the median and the spread (min..max)
// of their repetitions, never a single run.
#pragma once

#include <cstdint>
#include <span>

namespace tandem::bench {

struct summary {
  double median = 0;  // middle value; the mean of the two middle values for an even count
  double min = 0;
  double max = 0;
  int64_t count = 0;  // repetitions summarised; 0 means none (every field is then 0)
  // (max - min) / median: the relative width of the spread; 0 for a single sample or a zero
  // median.
  double spread() const { return median != 0 && count > 1 ? (max - min) / median : 0.0; }
};

// Median, min and max of the samples (any order; not modified). An empty span gives the
// all-zero summary. NaN samples are not supported.
summary summarize(std::span<const double> samples);

}  // namespace tandem::bench
