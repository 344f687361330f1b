// Internal to the configs loaders: typed reads of yaml-cpp nodes whose errors name the file,
// line, column and key path ("roster.yaml:12:15: models[1].priority: expected an integer").
#pragma once

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <initializer_list>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "configs/byte_size.h"
#include "configs/duration.h"
#include "configs/roster_loader.h"

namespace tandem::configs::detail {

// Builds messages that name the file, the line and column, and the key's path.
class reader {
 public:
  reader(std::string source, std::string base_dir, roster_options o = {}) : source_(std::move(source)), base_(std::move(base_dir)), o_(o) {}

  [[noreturn]] void fail(const YAML::Node& at, const std::string& path, const std::string& what) const {
    const auto m = at.Mark();
    throw config_error(where(m.line, m.column) + (path.empty() ? "" : path + ": ") + what);
  }
  std::string where(int line, int column) const { return source_ + ":" + std::to_string(line + 1) + ":" + std::to_string(column + 1) + ": "; }

  void expect_map(const YAML::Node& n, const std::string& path) const {
    if (!n.IsMap()) fail(n, path, "expected a mapping of keys, got " + kind(n));
  }
  // Rejects keys outside `allowed`, naming them all.
  void only_keys(const YAML::Node& n, const std::string& path, std::initializer_list<const char*> allowed) const {
    expect_map(n, path);
    for (const auto& kv : n) {
      const auto key = kv.first.Scalar();
      if (std::none_of(allowed.begin(), allowed.end(), [&](const char* a) { return key == a; })) {
        std::string list;
        for (const char* a : allowed) list += std::string(list.empty() ? "" : ", ") + a;
        fail(kv.first, join(path, key), "unknown key (expected one of: " + list + ")");
      }
    }
  }
  static std::string join(const std::string& path, const std::string& key) { return path.empty() ? key : path + "." + key; }
  static std::string kind(const YAML::Node& n) {
    if (n.IsMap()) return "a mapping";
    if (n.IsSequence()) return "a list";
    if (n.IsNull()) return "nothing";
    return "'" + n.Scalar() + "'";
  }

  std::string string(const YAML::Node& n, const std::string& path) const {
    if (!n.IsScalar()) fail(n, path, "expected a string, got " + kind(n));
    return n.Scalar();
  }
  int64_t integer(const YAML::Node& n, const std::string& path, int64_t lo, int64_t hi) const {
    if (!n.IsScalar()) fail(n, path, "expected an integer, got " + kind(n));
    const std::string& s = n.Scalar();
    size_t used = 0;
    int64_t v = 0;
    try {
      v = std::stoll(s, &used);
    } catch (...) {
      used = 0;
    }
    if (used == 0 || used != s.size()) fail(n, path, "expected an integer, got '" + s + "'");
    if (v < lo || v > hi) fail(n, path, "must be in [" + std::to_string(lo) + ", " + std::to_string(hi) + "], got " + s);
    return v;
  }
  double number(const YAML::Node& n, const std::string& path, double lo, double hi) const {
    if (!n.IsScalar()) fail(n, path, "expected a number, got " + kind(n));
    const std::string& s = n.Scalar();
    size_t used = 0;
    double v = 0;
    try {
      v = std::stod(s, &used);
    } catch (...) {
      used = 0;
    }
    if (used == 0 || used != s.size() || !(v >= lo && v <= hi))
      fail(n, path, "expected a number in [" + trim_number(lo) + ", " + trim_number(hi) + "], got '" + s + "'");
    return v;
  }
  bool boolean(const YAML::Node& n, const std::string& path) const {
    if (n.IsScalar() && (n.Scalar() == "true" || n.Scalar() == "false")) return n.Scalar() == "true";
    fail(n, path, "expected true or false, got " + kind(n));
  }
  uint64_t size(const YAML::Node& n, const std::string& path) const {
    if (n.IsScalar())
      if (const auto v = parse_byte_size(n.Scalar())) return *v;
    fail(n, path, "expected a size such as 512MiB, 22GiB or 4096 (bytes), got " + kind(n));
  }
  duration time(const YAML::Node& n, const std::string& path) const {
    if (n.IsScalar())
      if (const auto v = parse_duration(n.Scalar())) return *v;
    fail(n, path, "expected a duration such as 500ms, 30s, 5m or 2h, got " + kind(n));
  }
  template <class E>
  E choice(const YAML::Node& n, const std::string& path, std::initializer_list<std::pair<const char*, E>> options) const {
    std::string list;
    for (const auto& [name, v] : options) {
      if (n.IsScalar() && n.Scalar() == name) return v;
      list += std::string(list.empty() ? "" : ", ") + name;
    }
    fail(n, path, "expected one of " + list + ", got " + kind(n));
  }
  std::vector<std::string> strings(const YAML::Node& n, const std::string& path) const {
    if (!n.IsSequence()) fail(n, path, "expected a list of strings, got " + kind(n));
    std::vector<std::string> out;
    for (size_t i = 0; i < n.size(); ++i) out.push_back(string(n[i], path + "[" + std::to_string(i) + "]"));
    return out;
  }

  const std::string& base() const { return base_; }
  const roster_options& options() const { return o_; }

 private:
  static std::string trim_number(double v) {
    std::ostringstream s;
    s << v;
    return s.str();
  }
  std::string source_, base_;
  roster_options o_;
};

}  // namespace tandem::configs::detail
