#include "models/jinja/template.h"

#include <cmath>

#include "models/jinja/builtins.h"
#include "models/jinja/parser.h"

namespace tandem::models::jinja {

namespace {

enum class flow { normal, break_, continue_ };

value arithmetic(const std::string& op, const value& a, const value& b) {
  const bool nums = (a.is_number() || a.is_bool()) && (b.is_number() || b.is_bool());
  const bool ints = nums && a.type() != value::kind::number && b.type() != value::kind::number;
  auto bad = [&]() -> value {
    throw error(std::string("unsupported operand type(s) for ") + op + ": '" + a.type_name() + "' and '" + b.type_name() + "'", 0);
  };
  // Python's integers do not overflow; these do, so an overflow is an error instead.
  int64_t r = 0;
  auto checked = [&](bool overflow) -> value {  // (r written by the __builtin before this runs)
    if (overflow) throw error("integer overflow in '" + op + "'", 0);
    return value(r);
  };
  if (op == "+") {
    if (ints) return checked(__builtin_add_overflow(a.as_int(), b.as_int(), &r));
    if (nums) return value(a.as_double() + b.as_double());
    if (a.is_string() && b.is_string()) return value(a.as_string() + b.as_string());
    if (a.is_list() && b.is_list()) {
      value_list out = a.list();
      out.insert(out.end(), b.list().begin(), b.list().end());
      return value(std::move(out));
    }
    return bad();
  }
  if (op == "-") {
    if (ints) return checked(__builtin_sub_overflow(a.as_int(), b.as_int(), &r));
    if (nums) return value(a.as_double() - b.as_double());
    return bad();
  }
  if (op == "*") {
    if (ints) return checked(__builtin_mul_overflow(a.as_int(), b.as_int(), &r));
    if (nums) return value(a.as_double() * b.as_double());
    const value& seq = a.is_int() ? b : a;
    const value& times = a.is_int() ? a : b;
    if (times.is_int() && (seq.is_string() || seq.is_list())) {
      const int64_t n = std::max<int64_t>(0, times.as_int());
      if (n * std::max<int64_t>(1, length_of(seq)) > (int64_t{1} << 24)) throw error("a repetition of more than 16M items", 0);
      if (seq.is_string()) {
        std::string out;
        for (int64_t i = 0; i < n; ++i) out += seq.as_string();
        return value(std::move(out));
      }
      value_list out;
      for (int64_t i = 0; i < n; ++i) out.insert(out.end(), seq.list().begin(), seq.list().end());
      return value(std::move(out));
    }
    return bad();
  }
  if (!nums) return bad();
  if (op == "/") {
    if (b.as_double() == 0) throw error("division by zero", 0);
    return value(a.as_double() / b.as_double());
  }
  if (op == "//" || op == "%") {
    if (ints) {
      const int64_t x = a.as_int(), y = b.as_int();
      if (y == 0) throw error("integer division or modulo by zero", 0);
      if (x == INT64_MIN && y == -1) throw error("integer overflow in '" + op + "'", 0);
      int64_t q = x / y, m = x % y;
      if (m != 0 && ((m < 0) != (y < 0))) {  // Python floors
        --q;
        m += y;
      }
      return op == "//" ? value(q) : value(m);
    }
    const double x = a.as_double(), y = b.as_double();
    if (y == 0) throw error("float division or modulo by zero", 0);
    const double q = std::floor(x / y);
    return op == "//" ? value(q) : value(x - q * y);
  }
  if (op == "**") {
    if (ints && b.as_int() >= 0) {
      const int64_t base = a.as_int(), n = b.as_int();
      if (base == 0) return value(int64_t{n == 0 ? 1 : 0});
      if (base == 1) return value(int64_t{1});
      if (base == -1) return value(int64_t{n % 2 == 0 ? 1 : -1});
      int64_t p = 1;
      for (int64_t i = 0; i < n; ++i)  // (|base| >= 2: overflows within 63 steps)
        if (__builtin_mul_overflow(p, base, &p)) throw error("integer overflow in '**'", 0);
      return value(p);
    }
    return value(std::pow(a.as_double(), b.as_double()));
  }
  return bad();
}

bool contains(const value& seq, const value& item) {
  if (seq.is_string()) {
    if (!item.is_string()) throw error(std::string("'in <string>' requires string as left operand, not ") + item.type_name(), 0);
    return seq.as_string().find(item.as_string()) != std::string::npos;
  }
  if (seq.is_dict()) return item.is_string() && seq.dict_ref().find(item.as_string()) != nullptr;
  for (const auto& x : iterate(seq))
    if (equal(x, item)) return true;
  return false;
}

class interpreter {
 public:
  interpreter(const value& context, const render_options& o) : o_(o) {
    auto root = std::make_shared<value_dict>();
    add_globals(*root, o.now, namespaces_);
    if (context.is_dict())
      for (const auto& [k, v] : context.dict_ref().entries) root->set(k, v);
    scopes_.push_back(std::move(root));
  }

  ~interpreter() {
    // Namespaces are the only values a template can change after making them, so the only
    // way to a cycle: emptied here, whatever they hold is freed.
    for (auto& ns : *namespaces_) ns.dict_ref().entries.clear();
  }
  interpreter(const interpreter&) = delete;
  interpreter& operator=(const interpreter&) = delete;

  void run(const body& b, std::string& out) {
    if (exec(b, out) != flow::normal) throw error("'break' or 'continue' outside a loop", 0);
  }

 private:
  void check_size(const std::string& out, int line) const {
    if (out.size() > o_.max_output) throw error("the template wrote more than " + std::to_string(o_.max_output) + " bytes", line);
  }

  void step(int line) {
    if (++steps_ > o_.max_steps)
      throw error("the template ran more than " + std::to_string(o_.max_steps) + " steps (does it loop without end?)", line);
  }

  value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it)
      if (const value* v = (*it)->find(name)) return *v;
    return value::undefined_named(name);
  }

  void assign(const std::string& name, value v) { scopes_.back()->set(name, std::move(v)); }

  void assign_targets(const std::vector<std::string>& names, const value& v, int line) {
    if (names.size() == 1) {
      assign(names[0], v);
      return;
    }
    const value_list items = iterate(v);
    if (items.size() != names.size())
      throw error("cannot unpack " + std::to_string(items.size()) + " values into " + std::to_string(names.size()) + " names", line);
    for (size_t i = 0; i < names.size(); ++i) assign(names[i], items[i]);
  }

  flow exec(const body& b, std::string& out) {
    for (const auto& n : b) {
      const flow f = exec(*n, out);
      if (f != flow::normal) return f;
    }
    return flow::normal;
  }

  flow exec(const node& n, std::string& out) {
    step(n.line);
    try {
      switch (n.k) {
        case node::kind::text:
          out += n.text;
          check_size(out, n.line);
          return flow::normal;
        case node::kind::output:
          out += eval(*n.e).str();
          check_size(out, n.line);
          return flow::normal;
        case node::kind::if_:
          for (const auto& [cond, b] : n.branches)
            if (eval(*cond).truthy()) return exec(b, out);
          return exec(n.else_body, out);
        case node::kind::for_:
          return exec_for(n, out);
        case node::kind::set:
          if (n.attr_target) {
            value ns = lookup(n.targets[0]);
            if (!ns.is_dict() || !ns.dict_ref().is_namespace)
              throw error("cannot assign attribute '" + n.targets[1] + "' on '" + n.targets[0] + "', which is not a namespace", n.line);
            ns.dict_ref().set(n.targets[1], eval(*n.e));
          } else {
            assign_targets(n.targets, eval(*n.e), n.line);
          }
          return flow::normal;
        case node::kind::set_block: {
          std::string s;
          run_scoped(n.inner, s);
          assign(n.targets[0], value(std::move(s)));
          return flow::normal;
        }
        case node::kind::macro:
          assign(n.text, make_macro(n));
          return flow::normal;
        case node::kind::filter_block: {
          std::string s;
          run_scoped(n.inner, s);
          call_args a;
          for (const auto& p : n.params) a.positional.push_back(eval(*p.second));
          out += apply_filter(n.text, value(std::move(s)), a, caller()).str();
          return flow::normal;
        }
        case node::kind::break_:
          return flow::break_;
        case node::kind::continue_:
          return flow::continue_;
        case node::kind::scope:
          return exec(n.inner, out);
      }
    } catch (const raised&) {
      throw;
    } catch (const error& e) {
      if (e.line == 0) throw error(e.what(), n.line);
      throw;
    }
    return flow::normal;
  }

  // A block whose own flow may not leave it (set and filter blocks render into a string).
  void run_scoped(const body& b, std::string& out) {
    if (exec(b, out) != flow::normal) throw error("'break' or 'continue' outside a loop", 0);
  }

  flow exec_for(const node& n, std::string& out) {
    const value seq = eval(*n.e);
    value_list items = iterate(seq);
    if (n.loop_filter) {
      // The filter sees each item bound to the loop's names (without `loop`).
      value_list kept;
      for (const auto& item : items) {
        scopes_.push_back(std::make_shared<value_dict>());
        assign_targets(n.targets, item, n.line);
        const bool keep = eval(*n.loop_filter).truthy();
        scopes_.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec(n.else_body, out);
    const auto len = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < len; ++i) {
      step(n.line);
      // Each iteration has a scope of its own: a `set` inside does not outlive it (jinja2).
      scopes_.push_back(std::make_shared<value_dict>());
      value loop = value::dict();
      auto& d = loop.dict_ref();
      d.set("index", value(i + 1));
      d.set("index0", value(i));
      d.set("revindex", value(len - i));
      d.set("revindex0", value(len - i - 1));
      d.set("first", value(i == 0));
      d.set("last", value(i == len - 1));
      d.set("length", value(len));
      if (i > 0) d.set("previtem", items[static_cast<size_t>(i - 1)]);
      if (i + 1 < len) d.set("nextitem", items[static_cast<size_t>(i + 1)]);
      assign("loop", loop);
      assign_targets(n.targets, items[static_cast<size_t>(i)], n.line);
      const flow f = exec(n.branches[0].second, out);
      scopes_.pop_back();
      if (f == flow::break_) break;
    }
    return flow::normal;
  }

  value make_macro(const node& n) {
    const node* def = &n;
    return value::function(n.text, [this, def](call_args& a) {
      if (++depth_ > o_.max_depth) {
        --depth_;
        throw error("macro '" + def->text + "' nests more than " + std::to_string(o_.max_depth) + " calls deep", def->line);
      }
      // A macro sees the template's top-level names and its parameters, not its caller's.
      auto saved = std::move(scopes_);
      scopes_ = {saved.front(), std::make_shared<value_dict>()};
      std::string out;
      try {
        for (size_t i = 0; i < def->params.size(); ++i) {
          const auto& [pname, pdef] = def->params[i];
          value v = a.get(i, pname.c_str());
          if (v.is_undefined() && pdef) v = eval(*pdef);
          assign(pname, v);
        }
        run_scoped(def->inner, out);
      } catch (...) {
        scopes_ = std::move(saved);
        --depth_;
        throw;
      }
      scopes_ = std::move(saved);
      --depth_;
      return value(std::move(out));
    });
  }

  caller_fn caller() {
    return [](const value& fn, call_args& a) { return fn.call()(a); };
  }

  call_args arguments(const expr& e, size_t from) {
    call_args a;
    for (size_t i = from; i < e.args.size(); ++i) a.positional.push_back(eval(*e.args[i]));
    for (const auto& [k, v] : e.kwargs) a.keywords.emplace_back(k, eval(*v));
    return a;
  }

  value eval(const expr& e) {
    try {
      return eval_inner(e);
    } catch (const raised&) {
      throw;
    } catch (const error& x) {
      if (x.line == 0) throw error(x.what(), e.line);
      throw;
    }
  }

  value eval_inner(const expr& e) {
    switch (e.k) {
      case expr::kind::literal:
        return e.lit;
      case expr::kind::name:
        return lookup(e.name);
      case expr::kind::list: {
        value_list items;
        for (const auto& x : e.args) items.push_back(eval(*x));
        return e.name == "tuple" ? value::tuple(std::move(items)) : value(std::move(items));
      }
      case expr::kind::dict: {
        value d = value::dict();
        for (size_t i = 0; i + 1 < e.args.size(); i += 2) d.dict_ref().set(eval(*e.args[i]).str(), eval(*e.args[i + 1]));
        return d;
      }
      case expr::kind::attribute:
        return get_attribute(eval(*e.args[0]), e.name);
      case expr::kind::subscript:
        return get_item(eval(*e.args[0]), eval(*e.args[1]));
      case expr::kind::slice: {
        const value obj = eval(*e.args[0]);
        auto part = [&](size_t i) { return e.args[i] ? eval(*e.args[i]) : value(); };
        return get_slice(obj, part(1), part(2), part(3));
      }
      case expr::kind::call: {
        const value fn = eval(*e.args[0]);
        if (!fn.is_function()) {
          const std::string what = e.args[0]->k == expr::kind::name || e.args[0]->k == expr::kind::attribute ? e.args[0]->name : "value";
          throw error("'" + what + "' is " + (fn.is_undefined() ? "undefined" : std::string("not callable (") + fn.type_name() + ")"), e.line);
        }
        step(e.line);
        call_args a = arguments(e, 1);
        return fn.call()(a);
      }
      case expr::kind::filter: {
        const value v = eval(*e.args[0]);
        call_args a = arguments(e, 1);
        return apply_filter(e.name, v, a, caller());
      }
      case expr::kind::test: {
        const value v = eval(*e.args[0]);
        call_args a = arguments(e, 1);
        return value(apply_test(e.name, v, a) != e.negated);
      }
      case expr::kind::unary: {
        const value v = eval(*e.args[0]);
        if (e.name == "not") return value(!v.truthy());
        if (!v.is_number() && !v.is_bool()) throw error(std::string("bad operand type for unary ") + e.name + ": '" + v.type_name() + "'", e.line);
        if (e.name == "+") return v.is_bool() ? value(v.as_int()) : v;
        if (v.type() == value::kind::number) return value(-v.as_double());
        if (v.as_int() == INT64_MIN) throw error("integer overflow in unary '-'", e.line);
        return value(-v.as_int());
      }
      case expr::kind::binary: {
        const std::string& op = e.name;
        if (op == "and") {
          value a = eval(*e.args[0]);
          return a.truthy() ? eval(*e.args[1]) : a;
        }
        if (op == "or") {
          value a = eval(*e.args[0]);
          return a.truthy() ? a : eval(*e.args[1]);
        }
        const value a = eval(*e.args[0]), b = eval(*e.args[1]);
        if (op == "~") return value(a.str() + b.str());
        if (op == "==") return value(equal(a, b));
        if (op == "!=") return value(!equal(a, b));
        if (op == "<") return value(less(a, b));
        if (op == ">") return value(less(b, a));
        if (op == "<=") return value(!less(b, a));
        if (op == ">=") return value(!less(a, b));
        if (op == "in") return value(contains(b, a));
        if (op == "not in") return value(!contains(b, a));
        return arithmetic(op, a, b);
      }
      case expr::kind::ternary:
        if (eval(*e.args[1]).truthy()) return eval(*e.args[0]);
        return e.args[2] ? eval(*e.args[2]) : value();
    }
    return {};
  }

  const render_options& o_;
  std::shared_ptr<value_list> namespaces_ = std::make_shared<value_list>();
  std::vector<std::shared_ptr<value_dict>> scopes_;
  int64_t steps_ = 0;
  int depth_ = 0;
};

}  // namespace

program::program(std::string_view source) : body_(std::make_shared<body>(parse(source))) {}

std::string program::render(const value& context, const render_options& o) const {
  std::string out;
  interpreter(context, o).run(*body_, out);
  return out;
}

}  // namespace tandem::models::jinja
