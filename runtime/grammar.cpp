// GBNF text -> byte-level rules: one pass of recursive descent that lowers as it goes (groups
// and repetitions become helper rules, character classes their UTF-8 byte sequences), then the
// checks a matcher needs to terminate.
#include "runtime/grammar.h"

#include <algorithm>
#include <map>
#include <utility>

namespace tandem::runtime {

namespace {

using element = grammar::element;
using kind = grammar::kind;
using sequence = std::vector<element>;
using range = std::pair<uint32_t, uint32_t>;  // code points, inclusive

constexpr uint32_t k_max_code_point = 0x10FFFF;

bool is_name_char(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_'; }

int utf8_length(uint32_t cp) { return cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4; }

void utf8_encode(uint32_t cp, uint8_t out[4]) {
  const int n = utf8_length(cp);
  if (n == 1) {
    out[0] = static_cast<uint8_t>(cp);
    return;
  }
  static constexpr uint8_t lead[] = {0, 0, 0xC0, 0xE0, 0xF0};
  for (int i = n - 1; i > 0; --i, cp >>= 6) out[i] = static_cast<uint8_t>(0x80 | (cp & 0x3F));
  out[0] = static_cast<uint8_t>(lead[n] | cp);
}

// The byte-range sequences that spell exactly the code points lo..hi (no surrogates inside):
// split where the encoded length changes, then until every continuation position spans a
// whole or an aligned part, so each sequence is a product of byte ranges.
void utf8_sequences(uint32_t lo, uint32_t hi, std::vector<std::vector<std::pair<uint8_t, uint8_t>>>& out) {
  for (const uint32_t top : {0x7Fu, 0x7FFu, 0xFFFFu})
    if (lo <= top && top < hi) {
      utf8_sequences(lo, top, out);
      utf8_sequences(top + 1, hi, out);
      return;
    }
  const int n = utf8_length(lo);
  for (int i = 1; i < n; ++i) {
    const uint32_t m = (1u << (6 * i)) - 1;
    if ((lo & ~m) == (hi & ~m)) continue;
    if ((lo & m) != 0) {
      utf8_sequences(lo, lo | m, out);
      utf8_sequences((lo | m) + 1, hi, out);
      return;
    }
    if ((hi & m) != m) {
      utf8_sequences(lo, (hi & ~m) - 1, out);
      utf8_sequences(hi & ~m, hi, out);
      return;
    }
  }
  uint8_t a[4], b[4];
  utf8_encode(lo, a);
  utf8_encode(hi, b);
  std::vector<std::pair<uint8_t, uint8_t>> seq;
  for (int i = 0; i < n; ++i) seq.emplace_back(a[i], b[i]);
  out.push_back(std::move(seq));
}

class gbnf_parser {
 public:
  explicit gbnf_parser(std::string_view text) : s_(text) {}

  grammar parse() {
    skip(true);
    while (p_ < s_.size()) {
      parse_rule();
      skip(true);
    }
    for (const auto& [name, line] : referenced_)
      if (!defined_.count(name)) fail_at(line, "rule '" + name + "' is used but never defined");
    const auto root = ids_.find("root");
    if (root == ids_.end() || !defined_.count("root")) throw grammar_error("grammar: no 'root' rule");
    g_.root = root->second;
    flatten();
    check_termination();
    return std::move(g_);
  }

 private:
  [[noreturn]] void fail_at(size_t line, const std::string& what) const {
    throw grammar_error("grammar, line " + std::to_string(line) + ": " + what);
  }
  [[noreturn]] void fail(const std::string& what) const { fail_at(line_at(p_), what); }
  size_t line_at(size_t pos) const {
    return 1 + static_cast<size_t>(std::count(s_.begin(), s_.begin() + static_cast<std::ptrdiff_t>(std::min(pos, s_.size())), '\n'));
  }

  // Spaces and comments; newlines only when `newlines`.
  void skip(bool newlines) {
    while (p_ < s_.size()) {
      const char c = s_[p_];
      if (c == ' ' || c == '\t' || c == '\r' || (newlines && c == '\n'))
        ++p_;
      else if (c == '#')
        while (p_ < s_.size() && s_[p_] != '\n') ++p_;
      else
        break;
    }
  }

  std::string name() {
    const size_t b = p_;
    while (p_ < s_.size() && is_name_char(s_[p_])) ++p_;
    if (p_ == b) fail("expected a rule name");
    return std::string(s_.substr(b, p_ - b));
  }

  uint32_t rule_id(const std::string& n) {
    const auto it = ids_.find(n);
    if (it != ids_.end()) return it->second;
    const auto id = static_cast<uint32_t>(alts_.size());
    ids_.emplace(n, id);
    alts_.emplace_back();
    g_.names.push_back(n);
    return id;
  }

  uint32_t helper(const std::string& parent) {
    const auto id = static_cast<uint32_t>(alts_.size());
    alts_.emplace_back();
    g_.names.push_back(parent + "-" + std::to_string(++helpers_));
    return id;
  }

  void parse_rule() {
    const size_t line = line_at(p_);
    const std::string n = name();
    skip(false);
    if (s_.substr(p_, 3) != "::=") fail("expected '::=' after '" + n + "'");
    p_ += 3;
    skip(true);
    if (!defined_.emplace(n, line).second) fail_at(line, "rule '" + n + "' is defined twice");
    const uint32_t id = rule_id(n);
    current_ = n;
    alts_[id] = alternatives(false);
    if (p_ < s_.size() && s_[p_] != '\n') fail("unexpected '" + std::string(1, s_[p_]) + "'");
  }

  std::vector<sequence> alternatives(bool nested) {
    std::vector<sequence> out;
    out.push_back(seq(nested));
    for (;;) {
      // A top-level rule may go on with a line that begins with '|'.
      const size_t save = p_;
      skip(true);
      if (p_ >= s_.size() || s_[p_] != '|') {
        if (!nested) p_ = save;
        break;
      }
      ++p_;
      skip(true);
      out.push_back(seq(nested));
    }
    return out;
  }

  void grow(size_t n) {
    size_ += n;
    if (size_ > k_grammar_max_elements)
      throw grammar_error("grammar: too large (more than " + std::to_string(k_grammar_max_elements) + " elements once expanded)");
  }

  uint32_t set_id(const std::bitset<256>& b) {
    const auto key = b.to_string();
    const auto it = set_ids_.find(key);
    if (it != set_ids_.end()) return it->second;
    const auto id = static_cast<uint32_t>(g_.sets.size());
    g_.sets.push_back(b);
    set_ids_.emplace(key, id);
    return id;
  }

  element byte_element(uint8_t lo, uint8_t hi) {
    std::bitset<256> b;
    for (unsigned c = lo; c <= hi; ++c) b.set(c);
    return {kind::bytes, set_id(b)};
  }

  // A code-point set as elements: one byte set when every member is ASCII-or-same-length
  // single bytes, else a helper rule with one alternative per byte-range sequence.
  sequence class_elements(std::vector<range> rs, bool negate) {
    std::sort(rs.begin(), rs.end());
    std::vector<range> merged;
    for (const auto& r : rs)
      if (!merged.empty() && r.first <= merged.back().second + 1)
        merged.back().second = std::max(merged.back().second, r.second);
      else
        merged.push_back(r);
    if (negate) {
      std::vector<range> inv;
      uint32_t next = 0;
      for (const auto& r : merged) {
        if (r.first > next) inv.emplace_back(next, r.first - 1);
        next = r.second + 1;
      }
      if (next <= k_max_code_point) inv.emplace_back(next, k_max_code_point);
      merged = std::move(inv);
    }
    std::vector<range> valid;  // surrogates are not characters
    for (const auto& r : merged) {
      if (r.first < 0xD800 && r.second >= 0xD800) {
        valid.emplace_back(r.first, 0xD7FF);
        if (r.second > 0xDFFF) valid.emplace_back(0xE000, r.second);
      } else if (r.first >= 0xD800 && r.first <= 0xDFFF) {
        if (r.second > 0xDFFF) valid.emplace_back(0xE000, r.second);
      } else {
        valid.push_back(r);
      }
    }
    if (valid.empty()) fail("a character class that matches nothing");
    std::vector<std::vector<std::pair<uint8_t, uint8_t>>> seqs;
    for (const auto& r : valid) utf8_sequences(r.first, r.second, seqs);
    std::bitset<256> singles;
    std::vector<sequence> multi;
    for (const auto& q : seqs) {
      if (q.size() == 1) {
        for (unsigned c = q[0].first; c <= q[0].second; ++c) singles.set(c);
        continue;
      }
      sequence alt;
      for (const auto& [lo, hi] : q) alt.push_back(byte_element(lo, hi));
      multi.push_back(std::move(alt));
    }
    if (multi.empty()) {
      grow(1);
      return {{kind::bytes, set_id(singles)}};
    }
    if (singles.any()) multi.insert(multi.begin(), sequence{{kind::bytes, set_id(singles)}});
    const uint32_t id = helper(current_);
    for (const auto& a : multi) grow(a.size() + 1);
    alts_[id] = std::move(multi);
    grow(1);
    return {{kind::rule, id}};
  }

  uint32_t hex(size_t digits) {
    uint32_t v = 0;
    for (size_t i = 0; i < digits; ++i, ++p_) {
      if (p_ >= s_.size()) fail("unterminated escape");
      const char c = s_[p_];
      const int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
      if (d < 0) fail("expected a hex digit in an escape");
      v = v * 16 + static_cast<uint32_t>(d);
    }
    if (v > k_max_code_point) fail("escape beyond U+10FFFF");
    return v;
  }

  // One character of a literal or class: an escape or a UTF-8 character.
  uint32_t character() {
    if (p_ >= s_.size()) fail("unexpected end of grammar");
    const auto c = static_cast<unsigned char>(s_[p_]);
    if (c == '\\') {
      if (++p_ >= s_.size()) fail("unterminated escape");
      const char e = s_[p_++];
      switch (e) {
        case 'x':
          return hex(2);
        case 'u':
          return hex(4);
        case 'U':
          return hex(8);
        case 't':
          return '\t';
        case 'n':
          return '\n';
        case 'r':
          return '\r';
        case '\\':
        case '"':
        case '[':
        case ']':
        case '-':
        case '^':
          return static_cast<unsigned char>(e);
        default:
          fail(std::string("unknown escape '\\") + e + "'");
      }
    }
    const int n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || p_ + static_cast<size_t>(n) > s_.size()) fail("invalid UTF-8 in the grammar");
    uint32_t cp = n == 1 ? c : c & (0xFF >> (n + 1));
    for (int i = 1; i < n; ++i) {
      const auto t = static_cast<unsigned char>(s_[p_ + static_cast<size_t>(i)]);
      if ((t & 0xC0) != 0x80) fail("invalid UTF-8 in the grammar");
      cp = (cp << 6) | (t & 0x3F);
    }
    p_ += static_cast<size_t>(n);
    return cp;
  }

  sequence literal() {
    ++p_;  // "
    sequence out;
    while (p_ < s_.size() && s_[p_] != '"') {
      if (s_[p_] == '\n') fail("newline inside a literal");
      uint8_t b[4];
      const uint32_t cp = character();
      utf8_encode(cp, b);
      for (int i = 0; i < utf8_length(cp); ++i) out.push_back(byte_element(b[i], b[i]));
    }
    if (p_ >= s_.size()) fail("unterminated literal");
    ++p_;
    grow(out.size());
    return out;
  }

  sequence char_class() {
    ++p_;  // [
    bool negate = false;
    if (p_ < s_.size() && s_[p_] == '^') {
      negate = true;
      ++p_;
    }
    std::vector<range> rs;
    while (p_ < s_.size() && s_[p_] != ']') {
      if (s_[p_] == '\n') fail("newline inside a character class");
      const uint32_t lo = character();
      uint32_t hi = lo;
      if (p_ + 1 < s_.size() && s_[p_] == '-' && s_[p_ + 1] != ']') {
        ++p_;
        hi = character();
        if (hi < lo) fail("a character range whose end is before its start");
      }
      rs.emplace_back(lo, hi);
    }
    if (p_ >= s_.size()) fail("unterminated character class");
    ++p_;
    if (rs.empty() && !negate) fail("an empty character class");
    return class_elements(std::move(rs), negate);
  }

  size_t number() {
    const size_t b = p_;
    size_t v = 0;
    while (p_ < s_.size() && s_[p_] >= '0' && s_[p_] <= '9') {
      v = v * 10 + static_cast<size_t>(s_[p_++] - '0');
      if (v > k_grammar_max_repeat) fail("a repetition count above " + std::to_string(k_grammar_max_repeat));
    }
    if (p_ == b) fail("expected a number in a repetition");
    return v;
  }

  // `item` repeated min..max times (max < 0: unbounded), as plain copies then helper rules:
  // x* is R ::= x R | (nothing), right-recursive so a matcher's stack stays flat.
  sequence repeat(const sequence& item, size_t min, long max) {
    sequence unit = item;
    if (unit.size() != 1) {  // one element to repeat: a helper rule for longer items
      const uint32_t id = helper(current_);
      alts_[id] = {item};
      grow(item.size() + 2);
      unit = {{kind::rule, id}};
    }
    sequence out;
    for (size_t i = 0; i < min; ++i) out.push_back(unit[0]);
    grow(min);
    if (max < 0) {
      const uint32_t id = helper(current_);
      alts_[id] = {sequence{unit[0], {kind::rule, id}}, sequence{}};
      grow(5);
      out.push_back({kind::rule, id});
    } else if (static_cast<size_t>(max) > min) {
      // Optional copies nested: O1 ::= x | (nothing); Ok ::= x O(k-1) | (nothing).
      uint32_t inner = 0;
      for (size_t k = 0; k < static_cast<size_t>(max) - min; ++k) {
        const uint32_t id = helper(current_);
        alts_[id] =
            k == 0 ? std::vector<sequence>{sequence{unit[0]}, sequence{}} : std::vector<sequence>{sequence{unit[0], {kind::rule, inner}}, sequence{}};
        grow(5);
        inner = id;
      }
      out.push_back({kind::rule, inner});
    }
    return out;
  }

  sequence seq(bool nested) {
    sequence out;
    sequence last;  // the last item's elements, for a repetition operator
    size_t last_at = 0;
    for (;;) {
      skip(nested);
      if (p_ >= s_.size()) break;
      const char c = s_[p_];
      sequence item;
      if (c == '"') {
        item = literal();
      } else if (c == '[') {
        item = char_class();
      } else if (c == '.') {
        ++p_;
        item = class_elements({{0, k_max_code_point}}, false);
      } else if (c == '(') {
        ++p_;
        skip(true);
        const uint32_t id = helper(current_);
        auto alts = alternatives(true);
        skip(true);
        if (p_ >= s_.size() || s_[p_] != ')') fail("expected ')'");
        ++p_;
        for (const auto& a : alts) grow(a.size() + 1);
        alts_[id] = std::move(alts);
        item = {{kind::rule, id}};
        grow(1);
      } else if (is_name_char(c)) {
        const size_t at = p_;
        const std::string n = name();
        // A name followed by ::= starts the next rule: this sequence has ended.
        size_t q = p_;
        while (q < s_.size() && (s_[q] == ' ' || s_[q] == '\t')) ++q;
        if (s_.substr(q, 3) == "::=") {
          if (!nested) {
            p_ = at;
            break;
          }
          fail("a rule definition inside parentheses");
        }
        referenced_.emplace(n, line_at(at));
        item = {{kind::rule, rule_id(n)}};
        grow(1);
      } else if (c == '*' || c == '+' || c == '?' || c == '{') {
        if (last.empty()) fail(std::string("'") + c + "' with nothing before it to repeat");
        size_t min = 0;
        long max = -1;
        ++p_;
        if (c == '+') min = 1;
        if (c == '?') max = 1;
        if (c == '{') {
          skip(false);
          if (p_ < s_.size() && s_[p_] != ',') min = number();
          skip(false);
          if (p_ < s_.size() && s_[p_] == ',') {
            ++p_;
            skip(false);
            if (p_ < s_.size() && s_[p_] != '}') max = static_cast<long>(number());
          } else {
            max = static_cast<long>(min);
          }
          skip(false);
          if (p_ >= s_.size() || s_[p_] != '}') fail("expected '}' to close a repetition");
          ++p_;
          if (max >= 0 && static_cast<size_t>(max) < min) fail("a repetition {m,n} with n < m");
        }
        out.resize(last_at);
        item = repeat(last, min, max);
        last.clear();  // a repetition of a repetition needs parentheses
        out.insert(out.end(), item.begin(), item.end());
        continue;
      } else {
        break;
      }
      last_at = out.size();
      last = item;
      out.insert(out.end(), item.begin(), item.end());
    }
    return out;
  }

  void flatten() {
    g_.rules.resize(alts_.size());
    for (size_t r = 0; r < alts_.size(); ++r)
      for (const auto& a : alts_[r]) {
        g_.rules[r].push_back(static_cast<uint32_t>(g_.elements.size()));
        g_.elements.insert(g_.elements.end(), a.begin(), a.end());
        g_.elements.push_back({kind::end, 0});
      }
  }

  // A rule that can reach itself before consuming a byte would make a matcher expand forever.
  void check_termination() {
    const size_t n = g_.rules.size();
    std::vector<char> nullable(n, 0);
    for (bool changed = true; changed;) {
      changed = false;
      for (size_t r = 0; r < n; ++r) {
        if (nullable[r]) continue;
        for (const uint32_t start : g_.rules[r]) {
          bool all = true;
          for (uint32_t p = start; g_.elements[p].k != kind::end; ++p)
            if (g_.elements[p].k == kind::bytes || !nullable[g_.elements[p].arg]) {
              all = false;
              break;
            }
          if (all) {
            nullable[r] = 1;
            changed = true;
            break;
          }
        }
      }
    }
    std::vector<std::vector<uint32_t>> first(n);  // rules reachable before any byte
    for (size_t r = 0; r < n; ++r)
      for (const uint32_t start : g_.rules[r])
        for (uint32_t p = start; g_.elements[p].k == kind::rule; ++p) {
          first[r].push_back(g_.elements[p].arg);
          if (!nullable[g_.elements[p].arg]) break;
        }
    std::vector<uint8_t> mark(n, 0);  // 0 new, 1 on the path, 2 done
    std::vector<std::pair<uint32_t, size_t>> stack;
    for (size_t r0 = 0; r0 < n; ++r0) {
      if (mark[r0]) continue;
      stack.emplace_back(static_cast<uint32_t>(r0), 0);
      mark[r0] = 1;
      while (!stack.empty()) {
        auto& [r, i] = stack.back();
        if (i == first[r].size()) {
          mark[r] = 2;
          stack.pop_back();
          continue;
        }
        const uint32_t t = first[r][i++];
        if (mark[t] == 1) {
          std::string name = g_.names[t];
          const auto dash = name.rfind('-');
          if (dash != std::string::npos && dash + 1 < name.size() &&
              std::all_of(name.begin() + static_cast<std::ptrdiff_t>(dash) + 1, name.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
              !defined_.count(name))
            name = name.substr(0, dash);
          throw grammar_error("grammar: rule '" + name +
                              "' can recurse without consuming input (left recursion, or a repetition of something that may match nothing)");
        }
        if (mark[t] == 0) {
          mark[t] = 1;
          stack.emplace_back(t, 0);
        }
      }
    }
  }

  std::string_view s_;
  size_t p_ = 0;
  grammar g_;
  std::vector<std::vector<sequence>> alts_;  // per rule, before flattening
  std::map<std::string, uint32_t> ids_;
  std::map<std::string, size_t> defined_;     // rule -> line
  std::map<std::string, size_t> referenced_;  // rule -> first line using it
  std::map<std::string, uint32_t> set_ids_;
  std::string current_;
  size_t helpers_ = 0;
  size_t size_ = 0;
};

}  // namespace

grammar parse_gbnf(std::string_view text) { return gbnf_parser(text).parse(); }

}  // namespace tandem::runtime
