// The values a chat template computes with, as Python's jinja2 sees them: None, booleans,
// integers, floats, strings, lists, dicts (insertion-ordered, as Python's), callables, and
// jinja2's Undefined (what a missing variable, key or attribute gives). Lists and dicts are
// shared on copy, as Python objects are; a namespace() is a dict whose attributes `set`
// may assign. Formatting follows Python: str() for output, repr() inside containers, and
// json.dumps for the tojson filter.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace tandem::models::jinja {

class value;
struct call_args;
using value_list = std::vector<value>;
using native_function = std::function<value(call_args&)>;

// A dict: keys in insertion order (Python 3.7+), looked up by a linear scan (template dicts
// are small).
struct value_dict {
  std::vector<std::pair<std::string, value>> entries;
  bool is_namespace = false;  // namespace(): attributes assignable with `set ns.x = ...`
  const value* find(const std::string& key) const;
  void set(const std::string& key, value v);
};

class value {
 public:
  enum class kind { undefined, none, boolean, integer, number, string, list, dict, function };

  value() = default;  // undefined
  value(bool b) : k_(kind::boolean), i_(b ? 1 : 0) {}
  value(int v) : k_(kind::integer), i_(v) {}
  value(int64_t v) : k_(kind::integer), i_(v) {}
  value(double v) : k_(kind::number), d_(v) {}
  value(std::string s) : k_(kind::string), s_(std::move(s)) {}
  value(const char* s) : k_(kind::string), s_(s) {}
  value(value_list items);
  static value tuple(value_list items);  // a list that prints as Python's tuple: (1, 2)
  static value none();
  static value undefined_named(std::string name);  // an Undefined that remembers what was missing
  static value dict();
  static value function(std::string name, native_function f);
  static value from_json(const nlohmann::ordered_json& j);

  kind type() const { return k_; }
  bool is_undefined() const { return k_ == kind::undefined; }
  bool is_none() const { return k_ == kind::none; }
  bool is_bool() const { return k_ == kind::boolean; }
  bool is_int() const { return k_ == kind::integer; }
  bool is_number() const { return k_ == kind::integer || k_ == kind::number; }  // (booleans are not, unlike Python)
  bool is_string() const { return k_ == kind::string; }
  bool is_list() const { return k_ == kind::list; }
  bool is_tuple() const { return k_ == kind::list && tuple_; }
  bool is_dict() const { return k_ == kind::dict; }
  bool is_function() const { return k_ == kind::function; }

  bool truthy() const;
  bool as_bool() const { return i_ != 0; }
  // A float truncates toward zero (saturating; NaN gives 0), as int() would without bigints.
  int64_t as_int() const { return k_ == kind::number ? float_to_int(d_) : i_; }
  static int64_t float_to_int(double d) {
    if (!(d == d)) return 0;
    if (d >= 9.2233720368547758e18) return INT64_MAX;
    if (d <= -9.2233720368547758e18) return INT64_MIN;
    return static_cast<int64_t>(d);
  }
  double as_double() const { return k_ == kind::number ? d_ : static_cast<double>(i_); }
  const std::string& as_string() const { return s_; }  // string, or an Undefined's name
  value_list& list() const { return *list_; }
  value_dict& dict_ref() const { return *dict_; }
  const native_function& call() const { return *fn_; }
  const std::string& function_name() const { return s_; }
  bool same_object(const value& o) const;

  // Python's str() (what {{ }} prints: "" for Undefined, "None", "True", "1.0", "['a']") and
  // repr() (strings quoted as Python quotes them).
  std::string str() const;
  std::string repr() const;
  // Python's json.dumps(v, ensure_ascii=False, indent=indent, separators=...): indent < 0 is
  // None (", " and ": " between items), else newlines and `indent` spaces a level.
  std::string to_json(int indent = -1, bool sort_keys = false) const;
  nlohmann::ordered_json to_nlohmann() const;

  const char* type_name() const;  // for error messages: "str", "int", "list", "dict", ...

 private:
  kind k_ = kind::undefined;
  int64_t i_ = 0;
  double d_ = 0;
  bool tuple_ = false;
  std::string s_;
  std::shared_ptr<value_list> list_;
  std::shared_ptr<value_dict> dict_;
  std::shared_ptr<native_function> fn_;
};

// Python's == between two values (1 == 1.0, lists and dicts by their elements).
bool equal(const value& a, const value& b);
// Python's <, for numbers, strings (by code point) and lists; throws error otherwise.
bool less(const value& a, const value& b);
// Python's repr() of a float: the shortest text that reads back the same, "1.0", "1e+16".
std::string python_float(double d);

// What a builtin receives: positional arguments, then keyword ones.
struct call_args {
  value_list positional;
  std::vector<std::pair<std::string, value>> keywords;
  // The i-th positional argument or the keyword `name`, else `fallback`.
  value get(size_t i, const char* name, value fallback = {}) const;
};

}  // namespace tandem::models::jinja
