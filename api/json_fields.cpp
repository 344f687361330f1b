#include "api/json_fields.h"

#include <cmath>
#include <cstdio>
#include <limits>

#include "api/api_error.h"

namespace tandem::api {
namespace {

using json = nlohmann::json;

[[noreturn]] void fail(const std::string& path, const std::string& what) { throw bad_request("'" + path + "' " + what, path); }

std::string format_number(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", v);
  return text;
}

std::string show(double v) { return format_number(v); }
std::string show(int64_t v) { return std::to_string(v); }

// "between 0 and 2", "at least 1", "at most 5": an infinite or type-extreme bound is no bound.
template <class T>
std::string range_text(T min, T max, T lowest, T highest) {
  if (min == lowest) return "at most " + show(max);
  if (max == highest) return "at least " + show(min);
  return "between " + show(min) + " and " + show(max);
}

// 2^63 and 2^64 as doubles: integral floats at or past them do not fit the integer types.
constexpr double k_two_63 = 9223372036854775808.0;
constexpr double k_two_64 = 18446744073709551616.0;

// A float holding a whole number ("16.0"), accepted where an integer is expected: JSON does not
// tell 16 from 16.0 and some clients serialise every number as a double.
bool integral_float(const json& v) {
  if (!v.is_number_float()) return false;
  const double d = v.get<double>();
  return std::isfinite(d) && d == std::trunc(d);
}

}  // namespace

std::string field_path(std::string_view parent, std::string_view key) {
  if (parent.empty()) return std::string(key);
  std::string p(parent);
  p += '.';
  p += key;
  return p;
}

std::string index_path(std::string_view array_path, size_t i) { return std::string(array_path) + "[" + std::to_string(i) + "]"; }

const json* find_field(const json& obj, std::string_view key) {
  const auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

void expect_object(const json& v, const std::string& path) {
  if (v.is_object()) return;
  if (path.empty()) throw bad_request("the request body must be a JSON object");
  fail(path, "must be an object");
}

std::string as_string(const json& v, const std::string& path) {
  if (!v.is_string()) fail(path, "must be a string");
  return v.get<std::string>();
}

bool as_bool(const json& v, const std::string& path) {
  if (!v.is_boolean()) fail(path, "must be a boolean");
  return v.get<bool>();
}

double as_number(const json& v, const std::string& path, double min, double max) {
  if (!v.is_number()) fail(path, "must be a number");
  const double d = v.get<double>();
  // Written as "!(in range)" so NaN fails too (a parser may turn 1e999 into inf).
  if (!std::isfinite(d)) fail(path, "must be a finite number");
  if (!(d >= min && d <= max)) {
    constexpr double inf = std::numeric_limits<double>::infinity();
    fail(path, "must be " + range_text<double>(min, max, -inf, inf) + ", got " + format_number(d));
  }
  return d;
}

int64_t as_integer(const json& v, const std::string& path, int64_t min, int64_t max) {
  constexpr int64_t lowest = std::numeric_limits<int64_t>::min();
  constexpr int64_t highest = std::numeric_limits<int64_t>::max();
  auto out_of_range = [&](const std::string& got) -> void {
    fail(path, "must be " + range_text<int64_t>(min, max, lowest, highest) + ", got " + got);
  };
  int64_t n = 0;
  if (v.is_number_unsigned()) {
    const auto u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(highest)) out_of_range(std::to_string(u));
    n = static_cast<int64_t>(u);
  } else if (v.is_number_integer()) {
    n = v.get<int64_t>();
  } else if (integral_float(v)) {
    const double d = v.get<double>();
    if (d < -k_two_63 || d >= k_two_63) out_of_range(format_number(d));
    n = static_cast<int64_t>(d);
  } else {
    fail(path, "must be an integer");
  }
  if (n < min || n > max) out_of_range(std::to_string(n));
  return n;
}

std::string require_string(const json& obj, std::string_view key, std::string_view parent) {
  const json* v = find_field(obj, key);
  const std::string path = field_path(parent, key);
  if (!v) fail(path, "is required");
  return as_string(*v, path);
}

std::optional<std::string> optional_string(const json& obj, std::string_view key, std::string_view parent) {
  const json* v = find_field(obj, key);
  if (!v) return std::nullopt;
  return as_string(*v, field_path(parent, key));
}

std::optional<bool> optional_bool(const json& obj, std::string_view key, std::string_view parent) {
  const json* v = find_field(obj, key);
  if (!v) return std::nullopt;
  return as_bool(*v, field_path(parent, key));
}

std::optional<double> optional_number(const json& obj, std::string_view key, double min, double max, std::string_view parent) {
  const json* v = find_field(obj, key);
  if (!v) return std::nullopt;
  return as_number(*v, field_path(parent, key), min, max);
}

std::optional<int64_t> optional_integer(const json& obj, std::string_view key, int64_t min, int64_t max, std::string_view parent) {
  const json* v = find_field(obj, key);
  if (!v) return std::nullopt;
  return as_integer(*v, field_path(parent, key), min, max);
}

const json* optional_object(const json& obj, std::string_view key, std::string_view parent) {
  const json* v = find_field(obj, key);
  if (v && !v->is_object()) fail(field_path(parent, key), "must be an object");
  return v;
}

const json* optional_array(const json& obj, std::string_view key, std::string_view parent) {
  const json* v = find_field(obj, key);
  if (v && !v->is_array()) fail(field_path(parent, key), "must be an array");
  return v;
}

std::optional<std::vector<std::string>> optional_string_array(const json& obj, std::string_view key, std::string_view parent) {
  const json* v = optional_array(obj, key, parent);
  if (!v) return std::nullopt;
  const std::string path = field_path(parent, key);
  std::vector<std::string> out;
  out.reserve(v->size());
  for (size_t i = 0; i < v->size(); ++i) out.push_back(as_string((*v)[i], index_path(path, i)));
  return out;
}

std::optional<uint64_t> optional_seed(const json& obj, std::string_view key, std::string_view parent) {
  const json* v = find_field(obj, key);
  if (!v) return std::nullopt;
  if (v->is_number_unsigned()) return v->get<uint64_t>();
  int64_t n = 0;
  if (v->is_number_integer()) {
    n = v->get<int64_t>();
  } else if (integral_float(*v)) {
    const double d = v->get<double>();
    if (d >= k_two_63 && d < k_two_64) return static_cast<uint64_t>(d);
    if (d < -k_two_63 || d >= k_two_63) fail(field_path(parent, key), "must fit a 64-bit integer, got " + format_number(d));
    n = static_cast<int64_t>(d);
  } else {
    fail(field_path(parent, key), "must be an integer");
  }
  if (n == -1) return std::nullopt;
  return static_cast<uint64_t>(n);
}

void reject_unknown_keys(const json& obj, std::span<const std::string_view> known, std::string_view parent) {
  for (const auto& [key, value] : obj.items()) {
    bool found = false;
    for (std::string_view k : known) found = found || k == key;
    if (!found) {
      const std::string path = field_path(parent, key);
      throw bad_request("Unrecognized request argument supplied: " + path, path);
    }
  }
}

}  // namespace tandem::api
