// A context-free grammar over bytes, compiled from GBNF (llama.cpp's grammar format), for
// constrained decoding (grammar_matcher.h). Code points become their UTF-8 bytes when the
// grammar is compiled, so matching works on token bytes, split characters included.
#pragma once

#include <bitset>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::runtime {

// A grammar that does not parse or cannot be matched; the message names the rule or line.
struct grammar_error : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// Rules are alternatives of elements; every alternative is a run in `elements` ended by an
// `end` element, so a position (an index into elements) says where a parse stands.
struct grammar {
  enum class kind : uint8_t { bytes, rule, end };
  struct element {
    kind k = kind::end;
    uint32_t arg = 0;  // bytes: index into sets; rule: rule id
  };
  std::vector<element> elements;
  std::vector<std::vector<uint32_t>> rules;  // per rule: its alternatives' first positions
  std::vector<std::string> names;            // per rule (helper rules: "<rule>-N")
  std::vector<std::bitset<256>> sets;        // byte sets the `bytes` elements match
  uint32_t root = 0;
};

// Limits on what a grammar may expand to, so a request cannot ask for an unbounded one.
constexpr size_t k_grammar_max_elements = 1 << 20;
constexpr uint32_t k_grammar_max_repeat = 10000;  // the largest m or n in x{m,n}

// GBNF as llama.cpp reads it: `name ::= alternatives`, "literals" and [classes] with \x \u \U
// \t \n \r escapes, `.` (any character), ( groups ), `*` `+` `?` `{m}` `{m,}` `{m,n}` `{,n}`,
// `#` comments; a rule ends at a newline outside parentheses (or continues on a line that
// begins with `|`). The start rule is `root`. Throws grammar_error for a syntax error (with
// the line), an undefined or twice-defined rule, a missing root, left recursion or a
// repetition of something that may match nothing (both would never end), and sizes past the
// limits above.
grammar parse_gbnf(std::string_view text);

}  // namespace tandem::runtime
