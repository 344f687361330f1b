// The numbers `GET /metrics` serves: a registry of counters, gauges and histograms rendered
// as Prometheus' text exposition format 0.0.4. Any thread may update it while another renders;
// one mutex guards everything, since the server touches it only a few times per request.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tandem::api {

enum class metric_type { counter, gauge, histogram };

// Label names and values in the order they are rendered, e.g. {{"model","chat"},{"outcome","stop"}}.
// A series is identified by the exact list: the same pairs in another order make another series,
// so callers should always pass a family's labels in one order.
using labels = std::vector<std::pair<std::string, std::string>>;

class metrics_registry {
 public:
  // Declares a family; it renders (HELP and TYPE only) from now on, in declaration order.
  // Names must match [a-zA-Z_:][a-zA-Z0-9_:]*. Histograms take their bucket upper bounds,
  // finite and strictly increasing (+Inf is implicit); other types take none. Declaring a name
  // again with the same type and buckets does nothing (the first help stays); with another
  // type or other buckets it throws. Bad input throws std::invalid_argument.
  void declare(std::string name, std::string help, metric_type type, std::vector<double> buckets = {});

  // Each throws std::invalid_argument naming the metric when it is undeclared or of another
  // type, or on a bad label name ([a-zA-Z_][a-zA-Z0-9_]*, no repeats, and no "le" on a
  // histogram). A series is created, at the end of its family, on first use.
  void add(std::string_view name, const labels& l, double v = 1);  // counter; v >= 0
  void set(std::string_view name, const labels& l, double v);      // gauge
  void observe(std::string_view name, const labels& l, double v);  // histogram

  // The whole exposition text, each line ending in '\n'; empty when nothing is declared.
  std::string render() const;

 private:
  struct series {
    std::string label_text;             // rendered `k="v",...` (escaped), also the lookup key
    double value = 0;                   // counter or gauge; a histogram's sum
    uint64_t count = 0;                 // histogram: observations
    std::vector<uint64_t> bucket_hits;  // histogram: per bucket, not cumulative; last is +Inf
  };
  struct family {
    std::string name;
    std::string help;
    metric_type type;
    std::vector<double> buckets;
    std::vector<series> all;  // first-seen order
    std::unordered_map<std::string, size_t> by_labels;
  };

  // Both are called with mutex_ held and throw std::invalid_argument naming the metric.
  family& family_of(std::string_view name, metric_type want);  // declared, and of type `want`
  series& series_of(family& f, const labels& l);               // created at the end if new

  mutable std::mutex mutex_;
  std::vector<family> families_;  // declaration order
  std::map<std::string, size_t, std::less<>> by_name_;
};

// Bucket bounds in seconds for request and step latencies: fine below 100 ms, where token
// steps fall, and coarse up to 80 s, where whole requests end.
std::vector<double> latency_buckets();

// A sample value as the exposition writes it: integral values below 2^53 without a decimal
// point ("3", "-2"), others in shortest round-trip form ("0.25", "1e+300"); "+Inf", "-Inf", "NaN".
std::string format_metric_value(double v);

}  // namespace tandem::api
