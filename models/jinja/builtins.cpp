#include "models/jinja/builtins.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <set>

#include "models/jinja/error.h"
#include "models/unicode.h"

namespace tandem::models::jinja {

namespace {

// A UTF-8 string's characters (code points), each as its bytes.
std::vector<std::string> chars_of(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const size_t n = utf8_lead_len(static_cast<uint8_t>(s[i]));
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

bool py_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

std::string strip(const std::string& s, bool left, bool right, const value& chars) {
  const bool custom = chars.is_string();
  const auto drop = [&](char c) { return custom ? chars.as_string().find(c) != std::string::npos : py_space(c); };
  size_t b = 0, e = s.size();
  if (left)
    while (b < e && drop(s[b])) ++b;
  if (right)
    while (e > b && drop(s[e - 1])) --e;
  return s.substr(b, e - b);
}

std::string lower(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}
std::string upper(std::string s) {
  for (auto& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
std::string title(const std::string& s) {
  std::string out = s;
  bool start = true;
  for (auto& c : out) {
    const auto u = static_cast<unsigned char>(c);
    if (std::isalpha(u)) {
      c = static_cast<char>(start ? std::toupper(u) : std::tolower(u));
      start = false;
    } else {
      start = u < 0x80;  // (non-ASCII letters are left as they are)
    }
  }
  return out;
}
std::string capitalize(const std::string& s) {
  std::string out = lower(s);
  if (!out.empty()) out[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(out[0])));
  return out;
}

std::string replace(const std::string& s, const std::string& from, const std::string& to, int64_t count) {
  if (from.empty()) {
    // Python inserts `to` between characters (and at both ends).
    std::string out;
    int64_t n = 0;
    for (const auto& ch : chars_of(s)) {
      if (count < 0 || n < count) {
        out += to;
        ++n;
      }
      out += ch;
    }
    if (count < 0 || n < count) out += to;
    return out;
  }
  std::string out;
  size_t at = 0;
  int64_t n = 0;
  while (count < 0 || n < count) {
    const size_t f = s.find(from, at);
    if (f == std::string::npos) break;
    out.append(s, at, f - at);
    out += to;
    at = f + from.size();
    ++n;
  }
  out.append(s, at);
  return out;
}

value_list split(const std::string& s, const value& sep, int64_t maxsplit) {
  value_list out;
  if (!sep.is_string()) {  // on runs of whitespace, empty parts dropped
    size_t i = 0;
    int64_t n = 0;
    while (true) {
      while (i < s.size() && py_space(s[i])) ++i;
      if (i >= s.size()) break;
      if (maxsplit >= 0 && n == maxsplit) {
        out.push_back(value(strip(s.substr(i), false, true, {})));
        break;
      }
      size_t e = i;
      while (e < s.size() && !py_space(s[e])) ++e;
      out.push_back(value(s.substr(i, e - i)));
      ++n;
      i = e;
    }
    return out;
  }
  const std::string& d = sep.as_string();
  if (d.empty()) throw error("empty separator", 0);
  size_t at = 0;
  int64_t n = 0;
  while (maxsplit < 0 || n < maxsplit) {
    const size_t f = s.find(d, at);
    if (f == std::string::npos) break;
    out.push_back(value(s.substr(at, f - at)));
    at = f + d.size();
    ++n;
  }
  out.push_back(value(s.substr(at)));
  return out;
}

bool affix(const std::string& s, const value& what, bool prefix) {
  const auto one = [&](const std::string& a) {
    return a.size() <= s.size() && (prefix ? s.compare(0, a.size(), a) == 0 : s.compare(s.size() - a.size(), a.size(), a) == 0);
  };
  if (what.is_list()) {
    for (const auto& w : what.list())
      if (w.is_string() && one(w.as_string())) return true;
    return false;
  }
  if (!what.is_string()) throw error(std::string(prefix ? "startswith" : "endswith") + " takes a string or a tuple of strings", 0);
  return one(what.as_string());
}

std::string join(const value_list& items, const std::string& sep) {
  std::string out;
  for (size_t i = 0; i < items.size(); ++i) {
    if (i) out += sep;
    out += items[i].str();
  }
  return out;
}

value bound(const std::string& name, std::function<value(call_args&)> f) { return value::function(name, std::move(f)); }

value string_method(const value& obj, const std::string& name) {
  const std::string s = obj.as_string();
  if (name == "strip" || name == "lstrip" || name == "rstrip")
    return bound(name, [s, name](call_args& a) { return value(strip(s, name != "rstrip", name != "lstrip", a.get(0, "chars"))); });
  if (name == "split" || name == "rsplit")
    return bound(name, [s](call_args& a) {
      const value m = a.get(1, "maxsplit", value(int64_t{-1}));
      return value(split(s, a.get(0, "sep"), m.is_number() ? m.as_int() : -1));
    });
  if (name == "startswith" || name == "endswith")
    return bound(name, [s, name](call_args& a) { return value(affix(s, a.get(0, "prefix"), name == "startswith")); });
  if (name == "upper") return bound(name, [s](call_args&) { return value(upper(s)); });
  if (name == "lower") return bound(name, [s](call_args&) { return value(lower(s)); });
  if (name == "title") return bound(name, [s](call_args&) { return value(title(s)); });
  if (name == "capitalize") return bound(name, [s](call_args&) { return value(capitalize(s)); });
  if (name == "replace")
    return bound(name, [s](call_args& a) {
      const value c = a.get(2, "count", value(int64_t{-1}));
      return value(replace(s, a.get(0, "old").str(), a.get(1, "new").str(), c.as_int()));
    });
  if (name == "find" || name == "rfind")
    return bound(name, [s, name](call_args& a) {
      const std::string x = a.get(0, "sub").str();
      const size_t f = name == "find" ? s.find(x) : s.rfind(x);
      return value(f == std::string::npos ? int64_t{-1} : static_cast<int64_t>(chars_of(s.substr(0, f)).size()));
    });
  if (name == "count")
    return bound(name, [s](call_args& a) {
      const std::string x = a.get(0, "sub").str();
      if (x.empty()) return value(static_cast<int64_t>(chars_of(s).size()) + 1);
      int64_t n = 0;
      for (size_t f = s.find(x); f != std::string::npos; f = s.find(x, f + x.size())) ++n;
      return value(n);
    });
  if (name == "join") return bound(name, [s](call_args& a) { return value(join(iterate(a.get(0, "iterable")), s)); });
  if (name == "splitlines")
    return bound(name, [s](call_args&) {
      value_list out;
      size_t at = 0;
      while (at < s.size()) {
        size_t e = s.find('\n', at);
        if (e == std::string::npos) e = s.size();
        std::string line = s.substr(at, e - at);
        if (!line.empty() && line.back() == '\r') line.pop_back();
        out.push_back(value(line));
        at = e + 1;
      }
      return value(std::move(out));
    });
  if (name == "isdigit" || name == "isalpha" || name == "isspace")
    return bound(name, [s, name](call_args&) {
      if (s.empty()) return value(false);
      for (const char c : s) {
        const auto u = static_cast<unsigned char>(c);
        if (name == "isdigit" ? !std::isdigit(u) : name == "isalpha" ? !std::isalpha(u) : !py_space(c)) return value(false);
      }
      return value(true);
    });
  return value::undefined_named(name);
}

value dict_method(const value& obj, const std::string& name) {
  if (name == "get")
    return bound(name, [obj](call_args& a) {
      const value key = a.get(0, "key");
      const value* v = key.is_string() ? obj.dict_ref().find(key.as_string()) : nullptr;
      return v ? *v : a.get(1, "default", value::none());
    });
  if (name == "items")
    return bound(name, [obj](call_args&) {
      value_list out;
      for (const auto& [k, v] : obj.dict_ref().entries) out.push_back(value::tuple(value_list{value(k), v}));
      return value(std::move(out));
    });
  if (name == "keys")
    return bound(name, [obj](call_args&) {
      value_list out;
      for (const auto& e : obj.dict_ref().entries) out.push_back(value(e.first));
      return value(std::move(out));
    });
  if (name == "values")
    return bound(name, [obj](call_args&) {
      value_list out;
      for (const auto& e : obj.dict_ref().entries) out.push_back(e.second);
      return value(std::move(out));
    });
  return value::undefined_named(name);
}

int64_t to_int(const value& v, int64_t fallback) {
  if (v.is_number() || v.is_bool()) return v.as_int();
  if (v.is_string()) {
    try {
      size_t used = 0;
      const std::string t = strip(v.as_string(), true, true, {});
      const int64_t x = std::stoll(t, &used);
      if (used == t.size()) return x;
      const double d = std::stod(t, &used);  // jinja2's int filter reads "3.5" as 3
      if (used == t.size()) return value::float_to_int(d);
    } catch (const std::exception&) {
    }
  }
  return fallback;
}

value attribute_of(const value& item, const value& attr) {
  // "a.b" walks nested attributes, and an integer part indexes, as jinja2's make_attrgetter.
  value v = item;
  for (const auto& part : split(attr.str(), value("."), -1)) {
    const std::string p = part.as_string();
    const bool digits = !p.empty() && std::all_of(p.begin(), p.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    int64_t index = 0;
    if (digits && std::from_chars(p.data(), p.data() + p.size(), index).ec != std::errc()) return value::undefined_named(p);
    v = digits ? get_item(v, value(index)) : (v.is_undefined() ? v : get_attribute(v, p));
  }
  return v;
}

call_args rest_args(const call_args& a, size_t from) {
  call_args r;
  for (size_t i = from; i < a.positional.size(); ++i) r.positional.push_back(a.positional[i]);
  r.keywords = a.keywords;
  return r;
}

value select_items(const value& v, call_args& a, bool by_attribute, bool keep) {
  value_list out;
  for (const auto& item : iterate(v)) {
    const value subject = by_attribute ? attribute_of(item, a.get(0, "attribute")) : item;
    const size_t test_at = by_attribute ? 1 : 0;
    bool pass;
    if (a.positional.size() <= test_at) {
      pass = subject.truthy();
    } else {
      call_args targs = rest_args(a, test_at + 1);
      pass = apply_test(a.positional[test_at].str(), subject, targs);
    }
    if (pass == keep) out.push_back(item);
  }
  return value(std::move(out));
}

// jinja2's do_indent, quirks included: a newline is added before splitting into lines (so a
// trailing newline keeps an empty last line), empty lines stay unindented unless `blank`.
std::string indent(const std::string& s, const value& width, bool first, bool blank) {
  if (!width.is_string() && width.as_int() > 4096) throw error("indent: a width of more than 4096", 0);
  const std::string pad = width.is_string() ? width.as_string() : std::string(static_cast<size_t>(std::max<int64_t>(0, width.as_int())), ' ');
  std::vector<std::string> lines;
  const std::string text = s + "\n";
  size_t at = 0;
  while (at < text.size()) {
    size_t e = text.find('\n', at);
    std::string line = text.substr(at, e - at);
    if (!line.empty() && line.back() == '\r') line.pop_back();
    lines.push_back(std::move(line));
    at = e + 1;
  }
  std::string rv = lines[0];
  for (size_t i = 1; i < lines.size(); ++i) rv += "\n" + (blank || !lines[i].empty() ? pad + lines[i] : lines[i]);
  return first ? pad + rv : rv;
}

}  // namespace

int64_t length_of(const value& v) {
  switch (v.type()) {
    case value::kind::undefined:
      return 0;
    case value::kind::string:
      return static_cast<int64_t>(chars_of(v.as_string()).size());
    case value::kind::list:
      return static_cast<int64_t>(v.list().size());
    case value::kind::dict:
      return static_cast<int64_t>(v.dict_ref().entries.size());
    default:
      throw error(std::string("object of type '") + v.type_name() + "' has no len()", 0);
  }
}

value_list iterate(const value& v) {
  switch (v.type()) {
    case value::kind::undefined:
      return {};
    case value::kind::list:
      return v.list();
    case value::kind::dict: {
      value_list out;
      for (const auto& e : v.dict_ref().entries) out.push_back(value(e.first));
      return out;
    }
    case value::kind::string: {
      value_list out;
      for (auto& c : chars_of(v.as_string())) out.push_back(value(std::move(c)));
      return out;
    }
    default:
      throw error(std::string("'") + v.type_name() + "' object is not iterable", 0);
  }
}

value get_attribute(const value& obj, const std::string& name) {
  switch (obj.type()) {
    case value::kind::undefined:
      throw error("'" + (obj.as_string().empty() ? std::string("value") : obj.as_string()) + "' is undefined", 0);
    case value::kind::dict: {
      // Python's getattr first: a dict's own methods win over its keys (jinja2 does the same).
      if (!obj.dict_ref().is_namespace) {
        if (name == "get" || name == "items" || name == "keys" || name == "values") return dict_method(obj, name);
      }
      if (const value* v = obj.dict_ref().find(name)) return *v;
      return value::undefined_named(name);
    }
    case value::kind::string:
      return string_method(obj, name);
    default:
      return value::undefined_named(name);
  }
}

value get_item(const value& obj, const value& key) {
  switch (obj.type()) {
    case value::kind::undefined:
      throw error("'" + (obj.as_string().empty() ? std::string("value") : obj.as_string()) + "' is undefined", 0);
    case value::kind::dict: {
      if (key.is_string())
        if (const value* v = obj.dict_ref().find(key.as_string())) return *v;
      if (key.is_string()) return get_attribute(obj, key.as_string());  // jinja2 falls back to attributes
      return value::undefined_named(key.str());
    }
    case value::kind::list:
    case value::kind::string: {
      if (!key.is_int() && !key.is_bool()) {
        if (key.is_string()) return get_attribute(obj, key.as_string());
        return value::undefined_named(key.str());
      }
      int64_t i = key.as_int();
      if (obj.is_list()) {
        const auto n = static_cast<int64_t>(obj.list().size());
        if (i < 0) i += n;
        return i >= 0 && i < n ? obj.list()[static_cast<size_t>(i)] : value::undefined_named(key.str());
      }
      const auto cs = chars_of(obj.as_string());
      const auto n = static_cast<int64_t>(cs.size());
      if (i < 0) i += n;
      return i >= 0 && i < n ? value(cs[static_cast<size_t>(i)]) : value::undefined_named(key.str());
    }
    default:
      return value::undefined_named(key.str());
  }
}

value get_slice(const value& obj, const value& start, const value& stop, const value& step) {
  if (!obj.is_list() && !obj.is_string()) throw error(std::string("'") + obj.type_name() + "' object is not subscriptable", 0);
  const auto cs = obj.is_string() ? chars_of(obj.as_string()) : std::vector<std::string>{};
  const auto n = static_cast<int64_t>(obj.is_list() ? obj.list().size() : cs.size());
  const int64_t st = step.is_number() ? step.as_int() : 1;
  if (st == 0) throw error("slice step cannot be zero", 0);
  // Python's slice.indices.
  auto clamp = [&](const value& v, int64_t def) {
    if (!v.is_number()) return def;
    int64_t x = v.as_int();
    if (x < 0) x += n;
    if (st > 0) return std::clamp<int64_t>(x, 0, n);
    return std::clamp<int64_t>(x, -1, n - 1);
  };
  const int64_t b = clamp(start, st > 0 ? 0 : n - 1), e = clamp(stop, st > 0 ? n : -1);
  value_list items;
  std::string text;
  for (int64_t i = b; st > 0 ? i < e : i > e; i += st) {
    if (obj.is_list())
      items.push_back(obj.list()[static_cast<size_t>(i)]);
    else
      text += cs[static_cast<size_t>(i)];
  }
  return obj.is_list() ? value(std::move(items)) : value(std::move(text));
}

bool apply_test(const std::string& name, const value& v, call_args& a) {
  using k = value::kind;
  const value arg = a.get(0, "other");
  if (name == "defined") return !v.is_undefined();
  if (name == "undefined") return v.is_undefined();
  if (name == "none") return v.is_none();
  if (name == "string") return v.is_string();
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is_int();
  if (name == "float") return v.type() == k::number;
  if (name == "boolean") return v.is_bool();
  if (name == "true") return v.is_bool() && v.as_bool();
  if (name == "false") return v.is_bool() && !v.as_bool();
  if (name == "mapping") return v.is_dict();
  if (name == "iterable") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  if (name == "sequence") return v.is_list() || v.is_dict() || v.is_string() || v.is_undefined();
  if (name == "callable") return v.is_function();
  if (name == "even" || name == "odd") {
    if (!v.is_number()) throw error("the '" + name + "' test takes a number", 0);
    return (v.as_int() % 2 == 0) == (name == "even");
  }
  if (name == "divisibleby") return arg.as_int() == -1 || (arg.as_int() != 0 && v.as_int() % arg.as_int() == 0);
  if (name == "eq" || name == "equalto" || name == "==") return equal(v, arg);
  if (name == "ne" || name == "!=") return !equal(v, arg);
  if (name == "lt" || name == "lessthan" || name == "<") return less(v, arg);
  if (name == "gt" || name == "greaterthan" || name == ">") return less(arg, v);
  if (name == "le" || name == "<=") return !less(arg, v);
  if (name == "ge" || name == ">=") return !less(v, arg);
  if (name == "in") {
    const value seq = a.get(0, "seq");
    if (seq.is_string()) return v.is_string() && seq.as_string().find(v.as_string()) != std::string::npos;
    if (seq.is_dict()) return v.is_string() && seq.dict_ref().find(v.as_string());
    for (const auto& x : iterate(seq))
      if (equal(x, v)) return true;
    return false;
  }
  if (name == "lower") return v.is_string() && lower(v.as_string()) == v.as_string();
  if (name == "upper") return v.is_string() && upper(v.as_string()) == v.as_string();
  if (name == "sameas") return v.same_object(arg);
  throw error("no test named '" + name + "'", 0);
}

value apply_filter(const std::string& name, const value& v, call_args& a, const caller_fn& call) {
  if (name == "tojson") {
    const value ind = a.get(0, "indent");
    const value sort = a.get(99, "sort_keys", value(false));
    return value(v.to_json(ind.is_number() ? static_cast<int>(ind.as_int()) : -1, sort.truthy()));
  }
  if (name == "trim") return value(strip(v.str(), true, true, a.get(0, "chars")));
  if (name == "length" || name == "count") return value(length_of(v));
  if (name == "upper") return value(upper(v.str()));
  if (name == "lower") return value(lower(v.str()));
  if (name == "title") return value(title(v.str()));
  if (name == "capitalize") return value(capitalize(v.str()));
  if (name == "string") return value(v.str());
  if (name == "safe") return v;
  if (name == "replace") {
    const value c = a.get(2, "count", value(int64_t{-1}));
    return value(replace(v.str(), a.get(0, "old").str(), a.get(1, "new").str(), c.is_none() ? -1 : c.as_int()));
  }
  if (name == "join") {
    value_list items = iterate(v);
    const value attr = a.get(1, "attribute");
    if (!attr.is_undefined() && !attr.is_none())
      for (auto& i : items) i = attribute_of(i, attr);
    return value(join(items, a.get(0, "d", value("")).str()));
  }
  if (name == "first" || name == "last") {
    const auto items = iterate(v);
    if (items.empty()) return value::undefined_named(name);
    return name == "first" ? items.front() : items.back();
  }
  if (name == "list") return value(iterate(v));
  if (name == "int") return value(to_int(v, a.get(0, "default", value(int64_t{0})).as_int()));
  if (name == "float") {
    if (v.is_number() || v.is_bool()) return value(v.as_double());
    try {
      return value(std::stod(v.str()));
    } catch (const std::exception&) {
      return value(a.get(0, "default", value(0.0)).as_double());
    }
  }
  if (name == "default" || name == "d") {
    const bool boolean = a.get(1, "boolean", value(false)).truthy();
    if (v.is_undefined() || (boolean && !v.truthy())) return a.get(0, "default_value", value(""));
    return v;
  }
  if (name == "items") {
    if (v.is_undefined()) return value(value_list{});
    if (!v.is_dict()) throw error("the items filter takes a mapping", 0);
    call_args none;
    return dict_method(v, "items").call()(none);
  }
  if (name == "selectattr" || name == "rejectattr") return select_items(v, a, true, name == "selectattr");
  if (name == "select" || name == "reject") return select_items(v, a, false, name == "select");
  if (name == "map") {
    value_list out;
    const value attr = a.get(99, "attribute");
    if (!attr.is_undefined()) {
      const value def = a.get(99, "default");
      for (const auto& item : iterate(v)) {
        value x = attribute_of(item, attr);
        out.push_back(x.is_undefined() && !def.is_undefined() ? def : x);
      }
      return value(std::move(out));
    }
    if (a.positional.empty()) throw error("map needs a filter name or attribute=", 0);
    const std::string f = a.positional[0].str();
    call_args fargs = rest_args(a, 1);
    for (const auto& item : iterate(v)) out.push_back(apply_filter(f, item, fargs, call));
    return value(std::move(out));
  }
  if (name == "indent")
    return value(
        indent(v.str(), a.get(0, "width", value(int64_t{4})), a.get(1, "first", value(false)).truthy(), a.get(2, "blank", value(false)).truthy()));
  if (name == "unique") {
    value_list out;
    for (const auto& item : iterate(v))
      if (std::none_of(out.begin(), out.end(), [&](const value& o) { return equal(o, item); })) out.push_back(item);
    return value(std::move(out));
  }
  if (name == "reverse") {
    if (v.is_string()) {
      auto cs = chars_of(v.as_string());
      std::reverse(cs.begin(), cs.end());
      std::string s;
      for (const auto& c : cs) s += c;
      return value(s);
    }
    auto items = iterate(v);
    std::reverse(items.begin(), items.end());
    return value(std::move(items));
  }
  if (name == "sort") {
    auto items = iterate(v);
    const bool rev = a.get(0, "reverse", value(false)).truthy();
    const value attr = a.get(2, "attribute");
    std::stable_sort(items.begin(), items.end(), [&](const value& x, const value& y) {
      const value kx = attr.is_undefined() ? x : attribute_of(x, attr), ky = attr.is_undefined() ? y : attribute_of(y, attr);
      return rev ? less(ky, kx) : less(kx, ky);
    });
    return value(std::move(items));
  }
  if (name == "abs") {
    if (v.is_int() && v.as_int() == INT64_MIN) throw error("integer overflow in abs", 0);
    return v.is_int() ? value(static_cast<int64_t>(std::llabs(v.as_int()))) : value(std::fabs(v.as_double()));
  }
  if (name == "round") {
    const int64_t p = a.get(0, "precision", value(int64_t{0})).as_int();
    const double m = std::pow(10.0, static_cast<double>(p));
    return value(std::round(v.as_double() * m) / m);
  }
  if (name == "sum") {
    value total = a.get(1, "start", value(int64_t{0}));
    const value attr = a.get(0, "attribute");
    for (const auto& item : iterate(v)) {
      const value x = attr.is_undefined() || attr.is_none() ? item : attribute_of(item, attr);
      total = total.is_int() && x.is_int() ? value(total.as_int() + x.as_int()) : value(total.as_double() + x.as_double());
    }
    return total;
  }
  if (name == "min" || name == "max") {
    const auto items = iterate(v);
    if (items.empty()) return value::undefined_named(name);
    value best = items[0];
    for (const auto& x : items)
      if (name == "min" ? less(x, best) : less(best, x)) best = x;
    return best;
  }
  if (name == "wordcount") return value(static_cast<int64_t>(split(v.str(), {}, -1).size()));
  if (name == "attr") return get_attribute(v, a.get(0, "name").str());
  (void)call;
  throw error("no filter named '" + name + "'", 0);
}

void add_globals(value_dict& root, const std::optional<std::tm>& now, std::shared_ptr<value_list> namespaces) {
  root.set("raise_exception", value::function("raise_exception", [](call_args& a) -> value { throw raised(a.get(0, "message").str()); }));
  root.set("strftime_now", value::function("strftime_now", [now](call_args& a) {
             std::tm tm{};
             if (now) {
               tm = *now;
             } else {
               const std::time_t t = std::time(nullptr);
               localtime_r(&t, &tm);
             }
             char buf[256];
             const size_t n = std::strftime(buf, sizeof buf, a.get(0, "format").str().c_str(), &tm);
             return value(std::string(buf, n));
           }));
  root.set("namespace", value::function("namespace", [namespaces](call_args& a) {
             value ns = value::dict();
             ns.dict_ref().is_namespace = true;
             namespaces->push_back(ns);
             if (!a.positional.empty() && a.positional[0].is_dict())
               for (const auto& [k, v] : a.positional[0].dict_ref().entries) ns.dict_ref().set(k, v);
             for (const auto& [k, v] : a.keywords) ns.dict_ref().set(k, v);
             return ns;
           }));
  root.set("dict", value::function("dict", [](call_args& a) {
             value d = value::dict();
             for (const auto& [k, v] : a.keywords) d.dict_ref().set(k, v);
             return d;
           }));
  root.set("range", value::function("range", [](call_args& a) {
             int64_t start = 0, stop = 0, step = 1;
             if (a.positional.size() == 1) {
               stop = a.positional[0].as_int();
             } else if (a.positional.size() >= 2) {
               start = a.positional[0].as_int();
               stop = a.positional[1].as_int();
               if (a.positional.size() > 2) step = a.positional[2].as_int();
             }
             if (step == 0) throw error("range() arg 3 must not be zero", 0);
             value_list out;
             for (int64_t i = start; step > 0 ? i < stop : i > stop; i += step) {
               if (out.size() >= 1'000'000) throw error("range() of more than a million items", 0);
               out.push_back(value(i));
             }
             return value(std::move(out));
           }));
}

}  // namespace tandem::models::jinja
