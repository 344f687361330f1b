#include "runtime/grammar.h"

#include <doctest/doctest.h>

#include <memory>
#include <string>

#include "runtime/grammar_matcher.h"
#include "tests/runtime/grammar_test_util.h"

using namespace tandem::runtime;

using tandem::test::byte_vocab;

namespace {

// Whether `text` is a whole sentence of the grammar / a prefix of one.
bool matches(const std::string& gbnf, std::string_view text) {
  grammar_matcher m(std::make_shared<const grammar>(parse_gbnf(gbnf)), byte_vocab());
  return m.accept_bytes(text) && m.accepting();
}

bool prefix(const std::string& gbnf, std::string_view text) {
  grammar_matcher m(std::make_shared<const grammar>(parse_gbnf(gbnf)), byte_vocab());
  return m.accept_bytes(text);
}

std::string error_of(const std::string& gbnf) {
  try {
    (void)parse_gbnf(gbnf);
  } catch (const grammar_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_SUITE("grammar") {
  TEST_CASE("literals, alternatives, groups and references") {
    const std::string g = "root ::= \"yes\" | \"no\" | maybe\nmaybe ::= (\"may\" \"be\")";
    CHECK(matches(g, "yes"));
    CHECK(matches(g, "no"));
    CHECK(matches(g, "maybe"));
    CHECK_FALSE(matches(g, "ye"));
    CHECK(prefix(g, "ye"));
    CHECK_FALSE(prefix(g, "yes!"));
    CHECK_FALSE(matches(g, ""));
  }

  TEST_CASE("character classes, ranges, negation and escapes") {
    CHECK(matches("root ::= [a-c0-9_]", "b"));
    CHECK(matches("root ::= [a-c0-9_]", "_"));
    CHECK_FALSE(matches("root ::= [a-c0-9_]", "d"));
    CHECK(matches("root ::= [^a-c]", "d"));
    CHECK_FALSE(matches("root ::= [^a-c]", "a"));
    CHECK(matches(R"(root ::= "\x41\u00e9\t\n\"\\")", "A\xC3\xA9\t\n\"\\"));
    CHECK(matches(R"(root ::= [\]\-\\])", "]"));
    CHECK(matches(R"(root ::= [\]\-\\])", "-"));
    CHECK(matches(R"(root ::= [a-])", "-"));  // a '-' before ']' is itself
  }

  TEST_CASE("repetitions") {
    const std::string g = "root ::= \"a\"{2,3} \"b\"* \"c\"+ \"d\"? [x]{2} \"e\"{1,} \"f\"{,2}";
    CHECK(matches(g, "aacxxe"));
    CHECK(matches(g, "aaabbbcccdxxeeeff"));
    CHECK_FALSE(matches(g, "acxxe"));      // a{2,3}
    CHECK_FALSE(matches(g, "aaaacxxe"));   // a{2,3}
    CHECK_FALSE(matches(g, "aaxxe"));      // c+
    CHECK_FALSE(matches(g, "aacxxefff"));  // f{,2}
    CHECK(matches("root ::= (\"ab\" | \"c\")*", "abcab"));
    CHECK(matches("root ::= \"ab\"*", "abab"));
    CHECK_FALSE(matches("root ::= \"ab\"*", "aba"));
  }

  TEST_CASE("any character and UTF-8 classes work on bytes, split characters included") {
    CHECK(matches("root ::= .", "\xF0\x9F\x98\x80"));  // U+1F600
    CHECK(matches("root ::= .", "\n"));
    CHECK_FALSE(matches("root ::= .", "\xFF"));          // not UTF-8
    CHECK_FALSE(matches("root ::= .", "\xED\xA0\x80"));  // a surrogate
    CHECK_FALSE(matches("root ::= .", "\xC0\x80"));      // overlong
    CHECK(prefix("root ::= [α-ω]", "\xCE"));             // half of a Greek letter
    CHECK(matches("root ::= [α-ω]", "β"));
    CHECK_FALSE(matches("root ::= [α-ω]", "a"));
    CHECK(matches("root ::= [^\"]+", "héllo wörld ✓"));
    CHECK(matches("root ::= [\\u0800-\\U0010FFFF]", "\xE0\xA0\x80"));
    CHECK(matches("root ::= [\\u0800-\\U0010FFFF]", "\xF4\x8F\xBF\xBF"));
    CHECK_FALSE(matches("root ::= [\\u0800-\\U0010FFFF]", "\xDF\xBF"));
  }

  TEST_CASE("rules over several lines, comments, continuation with |") {
    const std::string g = R"(# a comment
root ::=
  "{" ws (
    item
    ("," ws item)*
  )? "}"   # trailing comment
item ::= [0-9]+ ws
ws ::= [ ]*
alt ::= "x"
  | "y"
)";
    CHECK(matches(g, "{}"));
    CHECK(matches(g, "{1, 22 ,3}"));
    CHECK_FALSE(matches(g, "{1,}"));
    CHECK(matches(g + "\nroot2 ::= alt", "{}"));
  }

  TEST_CASE("recursion that consumes input is fine, and the stack stays flat for loops") {
    const std::string g = "root ::= \"(\" root \")\" | \"\"";
    CHECK(matches(g, "((()))"));
    CHECK_FALSE(matches(g, "(()"));
    grammar_matcher m(std::make_shared<const grammar>(parse_gbnf("root ::= [a]*")), byte_vocab());
    CHECK(m.accept_bytes(std::string(5000, 'a')));
    CHECK(m.states() <= 3);  // one state however long the run
  }

  TEST_CASE("errors name the rule or the line") {
    CHECK(error_of("root ::= foo").find("rule 'foo' is used but never defined") != std::string::npos);
    CHECK(error_of("root ::= \"a\"\nroot ::= \"b\"").find("'root' is defined twice") != std::string::npos);
    CHECK(error_of("start ::= \"a\"").find("no 'root' rule") != std::string::npos);
    CHECK(error_of("root ::= root \"a\" | \"b\"").find("rule 'root' can recurse without consuming input") != std::string::npos);
    CHECK(error_of("root ::= a\na ::= b \"x\"\nb ::= \"\" | a").find("can recurse without consuming input") != std::string::npos);
    CHECK(error_of("root ::= (\"a\"?)*").find("can recurse without consuming input") != std::string::npos);
    CHECK(error_of("root ::= \"abc").find("line 1: unterminated literal") != std::string::npos);
    CHECK(error_of("root ::= [abc").find("unterminated character class") != std::string::npos);
    CHECK(error_of("root ::= \"\\q\"").find("unknown escape") != std::string::npos);
    CHECK(error_of("\n\nroot \"a\"").find("line 3: expected '::='") != std::string::npos);
    CHECK(error_of("root ::= \"a\" )").find("unexpected ')'") != std::string::npos);
    CHECK(error_of("root ::= (\"a\"").find("expected ')'") != std::string::npos);
    CHECK(error_of("root ::= \"a\"{3,2}").find("n < m") != std::string::npos);
    CHECK(error_of("root ::= \"a\"{99999}").find("repetition count above") != std::string::npos);
    CHECK(error_of("root ::= * \"a\"").find("nothing before it") != std::string::npos);
    CHECK(error_of("root ::= [z-a]").find("end is before its start") != std::string::npos);
    CHECK(error_of("root ::= [^\\x00-\\U0010FFFF]").find("matches nothing") != std::string::npos);
    CHECK(error_of("root ::= \"\\xff\xff\"").find("invalid UTF-8") != std::string::npos);
    std::string big = "root ::=";
    for (int i = 0; i < 110; ++i) big += " \"a\"{10000}";
    CHECK(error_of(big).find("too large") != std::string::npos);
    CHECK(error_of("root ::= (\"a\"{1000}){1000}").empty());  // a group is one rule, repeated by reference
    CHECK(error_of("").find("no 'root' rule") != std::string::npos);
  }
}
