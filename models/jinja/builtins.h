// jinja2's filters, tests, attribute lookup (string, list and dict methods included) and the
// globals chat templates call, over jinja::value. Internal to the template engine.
//
// Filters: abs, attr, capitalize, count, d/default, first, float, indent, int, items, join,
// last, length, list, lower, map, max, min, reject, rejectattr, replace, reverse, round, safe,
// select, selectattr, sort, string, sum, title, tojson, trim, unique, upper, wordcount.
// Tests: boolean, callable, defined, divisibleby, eq/equalto/==, even, false, float, ge/>=,
// gt/>, in, integer, iterable, le/<=, lower, lt/<, mapping, ne/!=, none, number, odd,
// sameas, sequence, string, true, undefined, upper.
// Methods: str.strip/lstrip/rstrip/split/rsplit/startswith/endswith/upper/lower/title/
// capitalize/replace/find/rfind/count/join/splitlines/isdigit/isalpha/isspace; dict.get/
// items/keys/values.
// Globals: raise_exception, strftime_now, namespace, range, dict.
#pragma once

#include <ctime>
#include <functional>
#include <memory>
#include <optional>
#include <string>

#include "models/jinja/value.h"

namespace tandem::models::jinja {

// Calls a callable value (a filter's `map` of another filter may need it). The interpreter
// provides this for macros; builtins receive it to call back.
using caller_fn = std::function<value(const value& fn, call_args& args)>;

value apply_filter(const std::string& name, const value& v, call_args& args, const caller_fn& call);
bool apply_test(const std::string& name, const value& v, call_args& args);
// obj.name: a dict's key (or one of its methods), a string's or list's method, a
// namespace's attribute; Undefined where Python's jinja2 gives Undefined. Throws jinja::error
// for an attribute of Undefined.
value get_attribute(const value& obj, const std::string& name);
// obj[key] and obj[a:b:c] (Python semantics, strings by code point).
value get_item(const value& obj, const value& key);
value get_slice(const value& obj, const value& start, const value& stop, const value& step);
// len(): code points of a string, items of a list or dict; 0 for Undefined.
int64_t length_of(const value& v);
// What `for` iterates: a list's items, a dict's keys, a string's characters; none for
// Undefined. Throws for anything else.
value_list iterate(const value& v);
// `namespaces` collects every namespace() made, so that the render can empty them when it
// ends: a namespace may hold itself (`set ns.me = ns`), a cycle shared pointers never free.
void add_globals(value_dict& root, const std::optional<std::tm>& now, std::shared_ptr<value_list> namespaces);

}  // namespace tandem::models::jinja
