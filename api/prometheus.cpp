#include "api/prometheus.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <stdexcept>

namespace tandem::api {

namespace {

const char* type_name(metric_type t) {
  switch (t) {
    case metric_type::counter:
      return "counter";
    case metric_type::gauge:
      return "gauge";
    case metric_type::histogram:
      return "histogram";
  }
  return "untyped";
}

bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_digit(char c) { return c >= '0' && c <= '9'; }

// Metric names may hold ':' (reserved for recording rules, but legal); label names may not.
bool valid_name(std::string_view s, bool allow_colon) {
  if (s.empty()) return false;
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    bool ok = is_name_start(c) || (allow_colon && c == ':') || (i > 0 && is_digit(c));
    if (!ok) return false;
  }
  return true;
}

std::invalid_argument metric_error(std::string_view name, std::string_view what) {
  return std::invalid_argument("prometheus metric '" + std::string(name) + "': " + std::string(what));
}

// HELP text escapes only backslash and newline; label values also escape the double quote.
void append_escaped(std::string& out, std::string_view s, bool quote) {
  for (char c : s) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else if (quote && c == '"')
      out += "\\\"";
    else
      out += c;
  }
}

std::string label_text(const labels& l) {
  std::string out;
  for (const auto& [k, v] : l) {
    if (!out.empty()) out += ',';
    out += k;
    out += "=\"";
    append_escaped(out, v, true);
    out += '"';
  }
  return out;
}

// One sample line: name{labels,extra} value. `extra` is the histogram's le="..." pair.
void append_sample(std::string& out, std::string_view name, std::string_view suffix, std::string_view labels_, std::string_view extra,
                   std::string_view value) {
  out += name;
  out += suffix;
  if (!labels_.empty() || !extra.empty()) {
    out += '{';
    out += labels_;
    if (!labels_.empty() && !extra.empty()) out += ',';
    out += extra;
    out += '}';
  }
  out += ' ';
  out += value;
  out += '\n';
}

}  // namespace

std::string format_metric_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  // Counts are the common case and read best without ".0" or an exponent; 2^53 is where
  // doubles stop holding every integer, so larger values keep their exact round-trip form.
  if (v == std::trunc(v) && std::fabs(v) < 9007199254740992.0) return std::to_string(static_cast<int64_t>(v));
  char buf[32];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::vector<double> latency_buckets() { return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 7.5, 10, 20, 40, 80}; }

void metrics_registry::declare(std::string name, std::string help, metric_type type, std::vector<double> buckets) {
  if (!valid_name(name, true)) throw metric_error(name, "name must match [a-zA-Z_:][a-zA-Z0-9_:]*");
  if (type != metric_type::histogram && !buckets.empty()) throw metric_error(name, "only a histogram takes buckets");
  for (size_t i = 0; i < buckets.size(); ++i) {
    if (!std::isfinite(buckets[i])) throw metric_error(name, "bucket bounds must be finite (+Inf is implicit)");
    if (i > 0 && !(buckets[i] > buckets[i - 1])) throw metric_error(name, "bucket bounds must be strictly increasing");
  }
  std::lock_guard lock(mutex_);
  if (auto it = by_name_.find(name); it != by_name_.end()) {
    // Declaring again is harmless when it agrees, so modules may each declare what they use.
    const family& f = families_[it->second];
    if (f.type != type) throw metric_error(name, std::string("already declared as a ") + type_name(f.type));
    if (f.buckets != buckets) throw metric_error(name, "already declared with other buckets");
    return;
  }
  by_name_.emplace(name, families_.size());
  families_.push_back(family{std::move(name), std::move(help), type, std::move(buckets), {}, {}});
}

metrics_registry::family& metrics_registry::family_of(std::string_view name, metric_type want) {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) throw metric_error(name, "not declared");
  family& f = families_[it->second];
  if (f.type != want) throw metric_error(name, std::string("is a ") + type_name(f.type) + ", not a " + type_name(want));
  return f;
}

metrics_registry::series& metrics_registry::series_of(family& f, const labels& l) {
  // Names are checked on every call, not only for new series: an invalid name such as
  // `a="x",b` could otherwise render to the same key as a valid series and land in it.
  for (size_t i = 0; i < l.size(); ++i) {
    const std::string& k = l[i].first;
    if (!valid_name(k, false)) throw metric_error(f.name, "label name '" + k + "' must match [a-zA-Z_][a-zA-Z0-9_]*");
    if (f.type == metric_type::histogram && k == "le") throw metric_error(f.name, "a histogram may not have a label 'le'");
    for (size_t j = 0; j < i; ++j)
      if (l[j].first == k) throw metric_error(f.name, "label '" + k + "' given twice");
  }
  std::string key = label_text(l);
  if (auto s = f.by_labels.find(key); s != f.by_labels.end()) return f.all[s->second];

  series s;
  s.label_text = key;
  if (f.type == metric_type::histogram) s.bucket_hits.assign(f.buckets.size() + 1, 0);
  f.by_labels.emplace(std::move(key), f.all.size());
  f.all.push_back(std::move(s));
  return f.all.back();
}

void metrics_registry::add(std::string_view name, const labels& l, double v) {
  // Written so that NaN fails too: a counter only ever goes up.
  if (!(v >= 0)) throw metric_error(name, "a counter increment must be >= 0, got " + format_metric_value(v));
  std::lock_guard lock(mutex_);
  series_of(family_of(name, metric_type::counter), l).value += v;
}

void metrics_registry::set(std::string_view name, const labels& l, double v) {
  std::lock_guard lock(mutex_);
  series_of(family_of(name, metric_type::gauge), l).value = v;
}

void metrics_registry::observe(std::string_view name, const labels& l, double v) {
  std::lock_guard lock(mutex_);
  family& f = family_of(name, metric_type::histogram);
  series& s = series_of(f, l);
  const std::vector<double>& b = f.buckets;
  // Bounds are inclusive (le = "less than or equal"). NaN must be sent to +Inf by hand:
  // lower_bound would put it in the first bucket, as no bound compares below it.
  size_t i = std::isnan(v) ? b.size() : static_cast<size_t>(std::lower_bound(b.begin(), b.end(), v) - b.begin());
  ++s.bucket_hits[i];
  ++s.count;
  s.value += v;
}

std::string metrics_registry::render() const {
  std::lock_guard lock(mutex_);
  std::string out;
  for (const family& f : families_) {
    out += "# HELP ";
    out += f.name;
    out += ' ';
    append_escaped(out, f.help, false);
    out += "\n# TYPE ";
    out += f.name;
    out += ' ';
    out += type_name(f.type);
    out += '\n';
    for (const series& s : f.all) {
      if (f.type != metric_type::histogram) {
        append_sample(out, f.name, "", s.label_text, "", format_metric_value(s.value));
        continue;
      }
      uint64_t cumulative = 0;
      for (size_t i = 0; i <= f.buckets.size(); ++i) {
        cumulative += s.bucket_hits[i];
        std::string le = "le=\"" + (i < f.buckets.size() ? format_metric_value(f.buckets[i]) : "+Inf") + '"';
        append_sample(out, f.name, "_bucket", s.label_text, le, std::to_string(cumulative));
      }
      append_sample(out, f.name, "_sum", s.label_text, "", format_metric_value(s.value));
      append_sample(out, f.name, "_count", s.label_text, "", std::to_string(s.count));
    }
  }
  return out;
}

}  // namespace tandem::api
