// The parsed form of a template: expressions and statements as plain trees.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "models/jinja/value.h"

namespace tandem::models::jinja {

struct expr;
using expr_ptr = std::unique_ptr<expr>;

struct expr {
  enum class kind {
    literal,    // lit
    name,       // name
    list,       // args
    dict,       // args: key, value, key, value, ...
    attribute,  // args[0].name
    subscript,  // args[0][args[1]]
    slice,      // args[0][args[1]:args[2]:args[3]] (null parts absent)
    call,       // args[0](args[1..], kwargs)
    filter,     // args[0] | name(args[1..], kwargs)
    test,       // args[0] is [not] name(args[1..])
    unary,      // name ("not", "-", "+") args[0]
    binary,     // args[0] name args[1]: + - * / // % ** ~ == != < > <= >= in "not in" and or
    ternary,    // args[0] if args[1] else args[2] (args[2] null: Undefined)
  };
  kind k = kind::literal;
  int line = 0;
  value lit;
  std::string name;
  bool negated = false;  // test: `is not`
  std::vector<expr_ptr> args;
  std::vector<std::pair<std::string, expr_ptr>> kwargs;
};

struct node;
using body = std::vector<std::unique_ptr<node>>;

struct node {
  enum class kind { text, output, if_, for_, set, set_block, macro, filter_block, break_, continue_, scope };
  kind k = kind::text;
  int line = 0;
  std::string text;                  // text; macro: its name; filter_block: the filter
  expr_ptr e;                        // output; for: the iterable; set: the value; filter_block: (unused)
  std::vector<std::string> targets;  // for / set: names assigned (several: unpacking); set: "ns.attr" as {"ns", "attr"} with attr_target
  bool attr_target = false;
  expr_ptr loop_filter;                                  // for ... if COND
  std::vector<std::pair<expr_ptr, body>> branches;       // if / elif (cond, body); for: {nullptr, body}
  body else_body;                                        // if / for
  body inner;                                            // set_block, macro, filter_block, scope
  std::vector<std::pair<std::string, expr_ptr>> params;  // macro (default may be null); filter_block: its arguments
};

}  // namespace tandem::models::jinja
