#include "models/jinja/parser.h"

#include <charconv>
#include <initializer_list>

#include "models/jinja/error.h"
#include "models/jinja/lexer.h"

namespace tandem::models::jinja {

namespace {

using tk = token::kind;

class parser {
 public:
  explicit parser(std::vector<token> t) : t_(std::move(t)) {}

  body run() {
    std::string stop;
    body b = statements({}, stop);
    if (!stop.empty()) throw error("unexpected '" + stop + "'", cur().line);
    return b;
  }

 private:
  const token& cur() const { return t_[i_]; }
  const token& peek(size_t n = 1) const { return t_[std::min(i_ + n, t_.size() - 1)]; }
  bool at_op(const char* op) const { return cur().k == tk::op && cur().text == op; }
  bool at_name(const char* n) const { return cur().k == tk::name && cur().text == n; }
  void advance() {
    if (i_ + 1 < t_.size()) ++i_;
  }
  [[noreturn]] void fail(const std::string& what) const { throw error(what, cur().line); }
  // Each level of brackets and statements recurses: a bound keeps hostile input off the
  // stack's end.
  struct nesting {
    parser& p;
    explicit nesting(parser& owner) : p(owner) {
      if (++p.depth_ > k_max_nesting) p.fail("expressions or blocks nest more than " + std::to_string(k_max_nesting) + " deep");
    }
    ~nesting() { --p.depth_; }
    nesting(const nesting&) = delete;
    nesting& operator=(const nesting&) = delete;
  };
  void expect_op(const char* op) {
    if (!at_op(op)) fail(std::string("expected '") + op + "'" + found());
    advance();
  }
  void expect_name(const char* n) {
    if (!at_name(n)) fail(std::string("expected '") + n + "'" + found());
    advance();
  }
  void expect(tk k, const char* what) {
    if (cur().k != k) fail(std::string("expected ") + what + found());
    advance();
  }
  std::string found() const {
    switch (cur().k) {
      case tk::end:
        return ", found the end of the template";
      case tk::block_end:
        return ", found the end of the tag";
      case tk::var_end:
        return ", found '}}'";
      default:
        return ", found '" + cur().text + "'";
    }
  }
  std::string identifier() {
    if (cur().k != tk::name) fail("expected a name" + found());
    std::string n = cur().text;
    advance();
    return n;
  }

  // Statements until a block tag named in `stops` (its name consumed and returned in `stop`;
  // the rest of that tag is the caller's) or the end of the template.
  body statements(std::initializer_list<const char*> stops, std::string& stop) {
    body out;
    while (cur().k != tk::end) {
      if (cur().k == tk::text) {
        auto n = std::make_unique<node>();
        n->k = node::kind::text;
        n->line = cur().line;
        n->text = cur().text;
        out.push_back(std::move(n));
        advance();
      } else if (cur().k == tk::var_begin) {
        auto n = std::make_unique<node>();
        n->k = node::kind::output;
        n->line = cur().line;
        advance();
        n->e = expression();
        expect(tk::var_end, "'}}'");
        out.push_back(std::move(n));
      } else if (cur().k == tk::block_begin) {
        advance();
        if (cur().k != tk::name) fail("expected a statement name" + found());
        for (const char* s : stops)
          if (cur().text == s) {
            stop = s;
            advance();
            return out;
          }
        out.push_back(statement());
      } else {
        fail("unexpected token" + found());
      }
    }
    stop.clear();
    if (stops.size() > 0) fail(std::string("the block is never closed (expected '") + *stops.begin() + "' or its end)");
    return out;
  }

  void end_tag() { expect(tk::block_end, "'%}'"); }

  body block_until(const char* end) {
    std::string stop;
    body b = statements({end}, stop);
    end_tag();
    return b;
  }

  std::unique_ptr<node> statement() {
    const nesting guard(*this);
    const std::string what = cur().text;
    const int line = cur().line;
    advance();
    auto n = std::make_unique<node>();
    n->line = line;
    if (what == "if") {
      n->k = node::kind::if_;
      auto cond = expression();
      end_tag();
      while (true) {
        std::string stop;
        body b = statements({"elif", "else", "endif"}, stop);
        n->branches.emplace_back(std::move(cond), std::move(b));
        if (stop == "elif") {
          cond = expression();
          end_tag();
          continue;
        }
        end_tag();
        if (stop == "else") n->else_body = block_until("endif");
        break;
      }
    } else if (what == "for") {
      n->k = node::kind::for_;
      n->targets.push_back(identifier());
      while (at_op(",")) {
        advance();
        n->targets.push_back(identifier());
      }
      expect_name("in");
      n->e = or_expr();  // (a full expression would take the `if` of a loop filter as a ternary)
      if (at_name("if")) {
        advance();
        n->loop_filter = expression();
      }
      if (at_name("recursive")) fail("recursive loops are not supported");
      end_tag();
      std::string stop;
      body b = statements({"else", "endfor"}, stop);
      end_tag();
      n->branches.emplace_back(nullptr, std::move(b));
      if (stop == "else") n->else_body = block_until("endfor");
    } else if (what == "set") {
      n->targets.push_back(identifier());
      if (at_op(".")) {
        advance();
        n->targets.push_back(identifier());
        n->attr_target = true;
      } else {
        while (at_op(",")) {
          advance();
          n->targets.push_back(identifier());
        }
      }
      if (cur().k == tk::block_end && !n->attr_target && n->targets.size() == 1) {
        n->k = node::kind::set_block;
        end_tag();
        n->inner = block_until("endset");
      } else {
        n->k = node::kind::set;
        expect_op("=");
        n->e = expression();
        if (at_op(",")) {  // a, b = x, y
          auto list = std::make_unique<expr>();
          list->k = expr::kind::list;
          list->name = "tuple";
          list->line = line;
          list->args.push_back(std::move(n->e));
          while (at_op(",")) {
            advance();
            list->args.push_back(expression());
          }
          n->e = std::move(list);
        }
        end_tag();
      }
    } else if (what == "macro") {
      n->k = node::kind::macro;
      n->text = identifier();
      expect_op("(");
      while (!at_op(")")) {
        std::string p = identifier();
        expr_ptr def;
        if (at_op("=")) {
          advance();
          def = expression();
        }
        n->params.emplace_back(std::move(p), std::move(def));
        if (!at_op(")")) expect_op(",");
      }
      advance();
      end_tag();
      n->inner = block_until("endmacro");
    } else if (what == "filter") {
      n->k = node::kind::filter_block;
      n->text = identifier();
      if (at_op("(")) {
        advance();
        while (!at_op(")")) {
          n->params.emplace_back(std::string(), expression());
          if (!at_op(")")) expect_op(",");
        }
        advance();
      }
      end_tag();
      n->inner = block_until("endfilter");
    } else if (what == "break" || what == "continue") {
      n->k = what == "break" ? node::kind::break_ : node::kind::continue_;
      end_tag();
    } else if (what == "generation") {
      // transformers' tag marking the assistant's tokens for training masks: renders its content.
      n->k = node::kind::scope;
      end_tag();
      n->inner = block_until("endgeneration");
    } else {
      throw error("unknown statement '" + what + "'", line);
    }
    return n;
  }

  expr_ptr make(expr::kind k, int line) {
    auto e = std::make_unique<expr>();
    e->k = k;
    e->line = line;
    return e;
  }

  expr_ptr binary(std::string op, expr_ptr a, expr_ptr b, int line) {
    auto e = make(expr::kind::binary, line);
    e->name = std::move(op);
    e->args.push_back(std::move(a));
    e->args.push_back(std::move(b));
    return e;
  }

 public:
  expr_ptr expression() {
    const nesting guard(*this);
    auto a = or_expr();
    while (at_name("if")) {
      const int line = cur().line;
      advance();
      auto cond = or_expr();
      expr_ptr other;
      if (at_name("else")) {
        advance();
        other = expression();
      }
      auto t = make(expr::kind::ternary, line);
      t->args.push_back(std::move(a));
      t->args.push_back(std::move(cond));
      t->args.push_back(std::move(other));
      a = std::move(t);
    }
    return a;
  }

 private:
  expr_ptr or_expr() {
    auto a = and_expr();
    while (at_name("or")) {
      const int line = cur().line;
      advance();
      a = binary("or", std::move(a), and_expr(), line);
    }
    return a;
  }
  expr_ptr and_expr() {
    auto a = not_expr();
    while (at_name("and")) {
      const int line = cur().line;
      advance();
      a = binary("and", std::move(a), not_expr(), line);
    }
    return a;
  }
  expr_ptr not_expr() {
    const nesting guard(*this);
    if (at_name("not")) {
      const int line = cur().line;
      advance();
      auto e = make(expr::kind::unary, line);
      e->name = "not";
      e->args.push_back(not_expr());
      return e;
    }
    return compare();
  }
  expr_ptr compare() {
    auto a = additive();
    while (true) {
      const int line = cur().line;
      std::string op;
      if (cur().k == tk::op &&
          (cur().text == "==" || cur().text == "!=" || cur().text == "<" || cur().text == ">" || cur().text == "<=" || cur().text == ">=")) {
        op = cur().text;
        advance();
      } else if (at_name("in")) {
        op = "in";
        advance();
      } else if (at_name("not") && peek().k == tk::name && peek().text == "in") {
        op = "not in";
        advance();
        advance();
      } else {
        return a;
      }
      a = binary(op, std::move(a), additive(), line);
    }
  }
  expr_ptr additive() {
    auto a = concat();
    while (at_op("+") || at_op("-")) {
      const std::string op = cur().text;
      const int line = cur().line;
      advance();
      a = binary(op, std::move(a), concat(), line);
    }
    return a;
  }
  expr_ptr concat() {
    auto a = multiplicative();
    while (at_op("~")) {
      const int line = cur().line;
      advance();
      a = binary("~", std::move(a), multiplicative(), line);
    }
    return a;
  }
  expr_ptr multiplicative() {
    auto a = power();
    while (at_op("*") || at_op("/") || at_op("//") || at_op("%")) {
      const std::string op = cur().text;
      const int line = cur().line;
      advance();
      a = binary(op, std::move(a), power(), line);
    }
    return a;
  }
  expr_ptr power() {
    auto a = unary(true);
    while (at_op("**")) {
      const int line = cur().line;
      advance();
      a = binary("**", std::move(a), unary(true), line);
    }
    return a;
  }
  expr_ptr unary(bool with_filter) {
    const nesting guard(*this);
    expr_ptr e;
    if (at_op("-") || at_op("+")) {
      const int line = cur().line;
      auto u = make(expr::kind::unary, line);
      u->name = cur().text;
      advance();
      u->args.push_back(unary(false));
      e = std::move(u);
    } else {
      e = postfix(primary());
    }
    return with_filter ? filters(std::move(e)) : std::move(e);
  }

  expr_ptr primary() {
    const token t = cur();
    switch (t.k) {
      case tk::string: {
        auto e = make(expr::kind::literal, t.line);
        std::string s = t.text;
        advance();
        while (cur().k == tk::string) {  // adjacent literals join, as in Python
          s += cur().text;
          advance();
        }
        e->lit = value(std::move(s));
        return e;
      }
      case tk::integer: {
        auto e = make(expr::kind::literal, t.line);
        int64_t v = 0;
        const auto r = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
        if (r.ec != std::errc()) fail("the integer " + t.text + " is out of range");
        e->lit = value(v);
        advance();
        return e;
      }
      case tk::number: {
        auto e = make(expr::kind::literal, t.line);
        double v = 0;
        const auto r = std::from_chars(t.text.data(), t.text.data() + t.text.size(), v);
        if (r.ec != std::errc()) fail("the number " + t.text + " is out of range");
        e->lit = value(v);
        advance();
        return e;
      }
      case tk::name: {
        advance();
        auto e = make(expr::kind::literal, t.line);
        if (t.text == "true" || t.text == "True") {
          e->lit = value(true);
        } else if (t.text == "false" || t.text == "False") {
          e->lit = value(false);
        } else if (t.text == "none" || t.text == "None") {
          e->lit = value::none();
        } else {
          e->k = expr::kind::name;
          e->name = t.text;
        }
        return e;
      }
      case tk::op:
        if (t.text == "(") {
          advance();
          if (at_op(")")) {  // the empty tuple
            advance();
            auto empty = make(expr::kind::list, t.line);
            empty->name = "tuple";
            return empty;
          }
          auto first = expression();
          if (!at_op(",")) {
            expect_op(")");
            return first;
          }
          auto list = make(expr::kind::list, t.line);
          list->name = "tuple";
          list->args.push_back(std::move(first));
          while (at_op(",")) {
            advance();
            if (at_op(")")) break;
            list->args.push_back(expression());
          }
          expect_op(")");
          return list;
        }
        if (t.text == "[") {
          advance();
          auto list = make(expr::kind::list, t.line);
          while (!at_op("]")) {
            list->args.push_back(expression());
            if (!at_op("]")) expect_op(",");
          }
          advance();
          return list;
        }
        if (t.text == "{") {
          advance();
          auto dict = make(expr::kind::dict, t.line);
          while (!at_op("}")) {
            dict->args.push_back(expression());
            expect_op(":");
            dict->args.push_back(expression());
            if (!at_op("}")) expect_op(",");
          }
          advance();
          return dict;
        }
        break;
      default:
        break;
    }
    fail("expected an expression" + found());
  }

  void call_arguments(expr& call) {
    expect_op("(");
    while (!at_op(")")) {
      if (cur().k == tk::name && peek().k == tk::op && peek().text == "=") {
        std::string key = cur().text;
        advance();
        advance();
        call.kwargs.emplace_back(std::move(key), expression());
      } else {
        if (!call.kwargs.empty()) fail("a positional argument follows keyword arguments");
        call.args.push_back(expression());
      }
      if (!at_op(")")) expect_op(",");
    }
    advance();
  }

  expr_ptr postfix(expr_ptr e) {
    while (true) {
      const int line = cur().line;
      if (at_op(".")) {
        advance();
        auto a = make(expr::kind::attribute, line);
        if (cur().k == tk::integer) {  // x.0: an item
          a->k = expr::kind::subscript;
          a->args.push_back(std::move(e));
          auto idx = make(expr::kind::literal, line);
          int64_t i = 0;
          const auto& digits = cur().text;
          if (std::from_chars(digits.data(), digits.data() + digits.size(), i).ec != std::errc()) fail("the index " + digits + " is out of range");
          idx->lit = value(i);
          advance();
          a->args.push_back(std::move(idx));
        } else {
          a->name = identifier();
          a->args.push_back(std::move(e));
        }
        e = std::move(a);
      } else if (at_op("[")) {
        advance();
        expr_ptr parts[3];
        int colons = 0;
        while (!at_op("]")) {
          if (at_op(":")) {
            if (++colons > 2) fail("a slice takes at most two ':'");
            advance();
            continue;
          }
          if (parts[colons]) fail("expected ':' or ']'" + found());
          parts[colons] = expression();
        }
        advance();
        if (colons == 0) {
          if (!parts[0]) fail("an empty subscript");
          auto s = make(expr::kind::subscript, line);
          s->args.push_back(std::move(e));
          s->args.push_back(std::move(parts[0]));
          e = std::move(s);
        } else {
          auto s = make(expr::kind::slice, line);
          s->args.push_back(std::move(e));
          for (auto& p : parts) s->args.push_back(std::move(p));
          e = std::move(s);
        }
      } else if (at_op("(")) {
        auto c = make(expr::kind::call, line);
        c->args.push_back(std::move(e));
        call_arguments(*c);
        e = std::move(c);
      } else {
        return e;
      }
    }
  }

  expr_ptr filters(expr_ptr e) {
    while (true) {
      const int line = cur().line;
      if (at_op("|")) {
        advance();
        auto f = make(expr::kind::filter, line);
        f->name = identifier();
        while (at_op(".")) {  // (dotted filter names)
          advance();
          f->name += "." + identifier();
        }
        f->args.push_back(std::move(e));
        if (at_op("(")) call_arguments(*f);
        e = std::move(f);
      } else if (at_name("is")) {
        advance();
        auto t = make(expr::kind::test, line);
        if (at_name("not")) {
          t->negated = true;
          advance();
        }
        t->name = identifier();
        t->args.push_back(std::move(e));
        if (at_op("(")) {
          call_arguments(*t);
        } else if ((cur().k == tk::string || cur().k == tk::integer || cur().k == tk::number || at_op("[") || at_op("{") ||
                    (cur().k == tk::name && !at_name("else") && !at_name("or") && !at_name("and") && !at_name("if") && !at_name("not") &&
                     !at_name("in") && !at_name("is")))) {
          t->args.push_back(postfix(primary()));  // `x is divisibleby 3`, `x is sameas none`
        }
        e = std::move(t);
      } else {
        return e;
      }
    }
  }

  static constexpr int k_max_nesting = 200;
  std::vector<token> t_;
  size_t i_ = 0;
  int depth_ = 0;
};

}  // namespace

body parse(std::string_view source) { return parser(tokenize(source)).run(); }

}  // namespace tandem::models::jinja
