#include "models/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "models/jinja/error.h"

namespace tandem::models::jinja {

const value* value_dict::find(const std::string& key) const {
  for (const auto& [k, v] : entries)
    if (k == key) return &v;
  return nullptr;
}

void value_dict::set(const std::string& key, value v) {
  for (auto& [k, old] : entries)
    if (k == key) {
      old = std::move(v);
      return;
    }
  entries.emplace_back(key, std::move(v));
}

value::value(value_list items) : k_(kind::list), list_(std::make_shared<value_list>(std::move(items))) {}

value value::tuple(value_list items) {
  value v(std::move(items));
  v.tuple_ = true;
  return v;
}

value value::none() {
  value v;
  v.k_ = kind::none;
  return v;
}

value value::undefined_named(std::string name) {
  value v;
  v.s_ = std::move(name);
  return v;
}

value value::dict() {
  value v;
  v.k_ = kind::dict;
  v.dict_ = std::make_shared<value_dict>();
  return v;
}

value value::function(std::string name, native_function f) {
  value v;
  v.k_ = kind::function;
  v.s_ = std::move(name);
  v.fn_ = std::make_shared<native_function>(std::move(f));
  return v;
}

value value::from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return none();
    case nlohmann::ordered_json::value_t::boolean:
      return value(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return value(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return value(static_cast<int64_t>(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float:
      return value(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return value(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      value_list items;
      items.reserve(j.size());
      for (const auto& e : j) items.push_back(from_json(e));
      return value(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      value d = dict();
      for (const auto& [k, e] : j.items()) d.dict_->entries.emplace_back(k, from_json(e));
      return d;
    }
    default:
      return {};
  }
}

bool value::truthy() const {
  switch (k_) {
    case kind::undefined:
    case kind::none:
      return false;
    case kind::boolean:
    case kind::integer:
      return i_ != 0;
    case kind::number:
      return d_ != 0;
    case kind::string:
      return !s_.empty();
    case kind::list:
      return !list_->empty();
    case kind::dict:
      return !dict_->entries.empty();
    case kind::function:
      return true;
  }
  return false;
}

bool value::same_object(const value& o) const {
  if (k_ != o.k_) return false;
  if (k_ == kind::list) return list_ == o.list_;
  if (k_ == kind::dict) return dict_ == o.dict_;
  return equal(*this, o);
}

std::string python_float(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  char buf[64];
  // Shortest round-trip digits, laid out as Python's repr: fixed between 1e-4 and 1e16,
  // scientific outside, always with a decimal point or an exponent.
  auto r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::scientific);
  std::string sci(buf, r.ptr);
  const auto e = sci.find('e');
  const int exp = std::stoi(sci.substr(e + 1));
  if (exp < -4 || exp >= 16) {
    std::string mant = sci.substr(0, e);
    char es[16];
    std::snprintf(es, sizeof es, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    return mant + es;
  }
  r = std::to_chars(buf, buf + sizeof buf, d, std::chars_format::fixed);
  std::string fixed(buf, r.ptr);
  if (fixed.find('.') == std::string::npos) fixed += ".0";
  return fixed;
}

namespace {

std::string repr_string(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos, has_double = s.find('"') != std::string::npos;
  const char q = has_single && !has_double ? '"' : '\'';
  std::string out(1, q);
  for (const unsigned char c : s) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (c == static_cast<unsigned char>(q)) {
          out += '\\';
          out += static_cast<char>(c);
        } else if (c < 0x20 || c == 0x7f) {
          char b[8];
          std::snprintf(b, sizeof b, "\\x%02x", c);
          out += b;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += q;
  return out;
}

void json_string(const std::string& s, std::string& out) {
  out += '"';
  for (const unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char b[8];
          std::snprintf(b, sizeof b, "\\u%04x", c);
          out += b;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

void json_into(const value& v, int indent, bool sort_keys, int depth, std::string& out) {
  if (depth > 256) throw error("tojson: the value nests more than 256 levels deep", 0);
  const auto newline = [&](int d) {
    out += '\n';
    out.append(static_cast<size_t>(indent * d), ' ');
  };
  const char* item_sep = indent < 0 ? ", " : ",";
  switch (v.type()) {
    case value::kind::undefined:
    case value::kind::none:
      out += "null";
      return;
    case value::kind::boolean:
      out += v.as_bool() ? "true" : "false";
      return;
    case value::kind::integer:
      out += std::to_string(v.as_int());
      return;
    case value::kind::number: {
      const double d = v.as_double();
      out += std::isnan(d) ? "NaN" : std::isinf(d) ? (d > 0 ? "Infinity" : "-Infinity") : python_float(d);
      return;
    }
    case value::kind::string:
      json_string(v.as_string(), out);
      return;
    case value::kind::list: {
      const auto& items = v.list();
      if (items.empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += item_sep;
        if (indent >= 0) newline(depth + 1);
        json_into(items[i], indent, sort_keys, depth + 1, out);
      }
      if (indent >= 0) newline(depth);
      out += ']';
      return;
    }
    case value::kind::dict: {
      auto entries = v.dict_ref().entries;
      if (entries.empty()) {
        out += "{}";
        return;
      }
      if (sort_keys) std::stable_sort(entries.begin(), entries.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
      out += '{';
      for (size_t i = 0; i < entries.size(); ++i) {
        if (i) out += item_sep;
        if (indent >= 0) newline(depth + 1);
        json_string(entries[i].first, out);
        out += ": ";
        json_into(entries[i].second, indent, sort_keys, depth + 1, out);
      }
      if (indent >= 0) newline(depth);
      out += '}';
      return;
    }
    case value::kind::function:
      throw error("tojson: a function is not JSON serializable", 0);
  }
}

}  // namespace

namespace {

// str() and repr() with a bound on nesting: a namespace may hold itself.
std::string str_of(const value& v, bool quoted, int depth) {
  if (depth > 256) throw error("the value nests more than 256 levels deep", 0);
  switch (v.type()) {
    case value::kind::undefined:
      return {};
    case value::kind::none:
      return "None";
    case value::kind::boolean:
      return v.as_bool() ? "True" : "False";
    case value::kind::integer:
      return std::to_string(v.as_int());
    case value::kind::number:
      return python_float(v.as_double());
    case value::kind::string:
      return quoted ? repr_string(v.as_string()) : v.as_string();
    case value::kind::list: {
      const auto& items = v.list();
      std::string out = v.is_tuple() ? "(" : "[";
      for (size_t i = 0; i < items.size(); ++i) {
        if (i) out += ", ";
        out += str_of(items[i], true, depth + 1);
      }
      if (v.is_tuple() && items.size() == 1) out += ",";
      return out + (v.is_tuple() ? ")" : "]");
    }
    case value::kind::dict: {
      const auto& d = v.dict_ref();
      std::string out = d.is_namespace ? "<Namespace {" : "{";
      for (size_t i = 0; i < d.entries.size(); ++i) {
        if (i) out += ", ";
        out += repr_string(d.entries[i].first) + ": " + str_of(d.entries[i].second, true, depth + 1);
      }
      return out + (d.is_namespace ? "}>" : "}");
    }
    case value::kind::function:
      return "<function " + v.function_name() + ">";
  }
  return {};
}

}  // namespace

std::string value::str() const { return str_of(*this, false, 0); }

std::string value::repr() const { return str_of(*this, true, 0); }

std::string value::to_json(int indent, bool sort_keys) const {
  std::string out;
  json_into(*this, indent, sort_keys, 0, out);
  return out;
}

nlohmann::ordered_json value::to_nlohmann() const {
  switch (k_) {
    case kind::boolean:
      return as_bool();
    case kind::integer:
      return i_;
    case kind::number:
      return d_;
    case kind::string:
      return s_;
    case kind::list: {
      auto a = nlohmann::ordered_json::array();
      for (const auto& e : *list_) a.push_back(e.to_nlohmann());
      return a;
    }
    case kind::dict: {
      auto o = nlohmann::ordered_json::object();
      for (const auto& [k, e] : dict_->entries) o[k] = e.to_nlohmann();
      return o;
    }
    default:
      return nullptr;
  }
}

const char* value::type_name() const {
  switch (k_) {
    case kind::undefined:
      return "undefined";
    case kind::none:
      return "NoneType";
    case kind::boolean:
      return "bool";
    case kind::integer:
      return "int";
    case kind::number:
      return "float";
    case kind::string:
      return "str";
    case kind::list:
      return "list";
    case kind::dict:
      return dict_->is_namespace ? "Namespace" : "dict";
    case kind::function:
      return "function";
  }
  return "?";
}

bool equal(const value& a, const value& b) {
  using k = value::kind;
  if ((a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool())) {
    if (a.type() == k::number || b.type() == k::number) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.type() != b.type()) return false;
  switch (a.type()) {
    case k::undefined:
    case k::none:
      return true;
    case k::string:
      return a.as_string() == b.as_string();
    case k::list: {
      const auto &x = a.list(), &y = b.list();
      if (x.size() != y.size()) return false;
      for (size_t i = 0; i < x.size(); ++i)
        if (!equal(x[i], y[i])) return false;
      return true;
    }
    case k::dict: {
      const auto &x = a.dict_ref().entries, &y = b.dict_ref().entries;
      if (x.size() != y.size()) return false;
      for (const auto& [key, v] : x) {
        const value* o = b.dict_ref().find(key);
        if (!o || !equal(v, *o)) return false;
      }
      return true;
    }
    case k::function:
      return a.same_object(b);
    default:
      return false;
  }
}

bool less(const value& a, const value& b) {
  if ((a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool())) return a.as_double() < b.as_double();
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();  // UTF-8 byte order is code point order
  if (a.is_list() && b.is_list()) {
    const auto &x = a.list(), &y = b.list();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (less(x[i], y[i])) return true;
      if (less(y[i], x[i])) return false;
    }
    return x.size() < y.size();
  }
  throw error(std::string("'<' not supported between instances of '") + a.type_name() + "' and '" + b.type_name() + "'", 0);
}

value call_args::get(size_t i, const char* name, value fallback) const {
  if (i < positional.size()) return positional[i];
  for (const auto& [k, v] : keywords)
    if (k == name) return v;
  return fallback;
}

}  // namespace tandem::models::jinja
