#include "runtime/json_schema.h"

#include <doctest/doctest.h>

#include <memory>
#include <string>

#include "runtime/grammar.h"
#include "runtime/grammar_matcher.h"
#include "tests/runtime/grammar_test_util.h"

using namespace tandem::runtime;
using ojson = nlohmann::ordered_json;

using tandem::test::byte_vocab;

namespace {

struct schema_grammar {
  std::shared_ptr<const grammar> g;
  explicit schema_grammar(const char* schema) : g(std::make_shared<const grammar>(parse_gbnf(json_schema_to_gbnf(ojson::parse(schema))))) {}
  bool accepts(std::string_view text) const {
    grammar_matcher m(g, byte_vocab());
    return m.accept_bytes(text) && m.accepting();
  }
};

std::string error_of(const char* schema) {
  try {
    (void)json_schema_to_gbnf(ojson::parse(schema));
  } catch (const schema_error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_SUITE("json_schema") {
  TEST_CASE("scalars") {
    const schema_grammar s(R"({"type": "object", "properties": {"s": {"type": "string"}, "i": {"type": "integer"},
      "n": {"type": "number"}, "b": {"type": "boolean"}, "z": {"type": "null"}}, "required": ["s", "i", "n", "b", "z"]})");
    CHECK(s.accepts(R"({"s": "a \"q\" \u00e9 ✓", "i": -12, "n": 3.5e-7, "b": true, "z": null})"));
    CHECK(s.accepts("{\n  \"s\":\"\",\n  \"i\":0,\"n\":0,\"b\":false,\"z\":null\n}"));
    CHECK(s.accepts(R"( {"s":"x","i":1,"n":-0.25,"b":true,"z":null})"));                        // leading whitespace
    CHECK_FALSE(s.accepts(R"({"s": "x", "i": 1.5, "n": 1, "b": true, "z": null})"));            // integer
    CHECK_FALSE(s.accepts(R"({"s": "x", "i": 01, "n": 1, "b": true, "z": null})"));             // leading zero
    CHECK_FALSE(s.accepts(R"({"s": "x", "i": 1, "n": 1, "b": "true", "z": null})"));            // boolean
    CHECK_FALSE(s.accepts(R"({"i": 1, "s": "x", "n": 1, "b": true, "z": null})"));              // the schema's order
    CHECK_FALSE(s.accepts(R"({"s": "x", "i": 1, "n": 1, "b": true})"));                         // required
    CHECK_FALSE(s.accepts("{\"s\": \"a\nb\", \"i\": 1, \"n\": 1, \"b\": true, \"z\": null}"));  // raw newline in a string
    CHECK_FALSE(s.accepts(std::string("{\"s\": \"x\"\n") + std::string(21, ' ') + ", \"i\": 1, \"n\": 1, \"b\": true, \"z\": null}"));
    CHECK_FALSE(s.accepts(R"({"s":  "x", "i": 1, "n": 1, "b": true, "z": null})"));  // two spaces
  }

  TEST_CASE("optional properties: any subset, in order") {
    const schema_grammar none(R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}, "c": {"type": "integer"}}})");
    for (const char* ok : {"{}", R"({"a": 1})", R"({"b": 2})", R"({"c": 3})", R"({"a": 1, "c": 3})", R"({"a":1,"b":2,"c":3})", R"({"b": 2, "c": 3})"})
      CHECK_MESSAGE(none.accepts(ok), ok);
    for (const char* bad : {R"({"b": 2, "a": 1})", R"({"a": 1,})", R"({, "a": 1})", R"({"d": 1})", R"({"a": 1, "a": 1})"})
      CHECK_MESSAGE(!none.accepts(bad), bad);
    const schema_grammar some(R"({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["b"]})");
    CHECK(some.accepts(R"({"b": 2})"));
    CHECK(some.accepts(R"({"b": 2, "a": 1})"));  // required first
    CHECK_FALSE(some.accepts(R"({"a": 1})"));
    CHECK_FALSE(some.accepts("{}"));
  }

  TEST_CASE("arrays, lengths, enums, const, nesting") {
    const schema_grammar s(R"({"type": "object", "properties": {
      "tags": {"type": "array", "items": {"type": "string", "maxLength": 3}, "minItems": 1, "maxItems": 2},
      "mode": {"enum": ["fast", "slow", 3, null]},
      "v": {"const": {"x": [1, "two"]}},
      "inner": {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
      "free": {"type": "array"}},
      "required": ["tags", "mode", "v", "inner", "free"]})");
    CHECK(s.accepts(R"({"tags": ["ab"], "mode": "fast", "v": {"x":[1,"two"]}, "inner": {"ok": true}, "free": []})"));
    CHECK(s.accepts(R"({"tags": ["ab", "cde"], "mode": 3, "v": {"x":[1,"two"]}, "inner": {"ok": false}, "free": [1, {"a": [null]}, "s"]})"));
    CHECK(s.accepts(R"({"tags": [""], "mode": null, "v": {"x":[1,"two"]}, "inner": {"ok": true}, "free": []})"));
    CHECK_FALSE(s.accepts(R"({"tags": [], "mode": "fast", "v": {"x":[1,"two"]}, "inner": {"ok": true}, "free": []})"));
    CHECK_FALSE(s.accepts(R"({"tags": ["a", "b", "c"], "mode": "fast", "v": {"x":[1,"two"]}, "inner": {"ok": true}, "free": []})"));
    CHECK_FALSE(s.accepts(R"({"tags": ["abcd"], "mode": "fast", "v": {"x":[1,"two"]}, "inner": {"ok": true}, "free": []})"));
    CHECK_FALSE(s.accepts(R"({"tags": ["a"], "mode": "medium", "v": {"x":[1,"two"]}, "inner": {"ok": true}, "free": []})"));
    CHECK_FALSE(s.accepts(R"({"tags": ["a"], "mode": "fast", "v": {"x":[2,"two"]}, "inner": {"ok": true}, "free": []})"));
  }

  TEST_CASE("$ref, recursion, anyOf, type lists, formats") {
    const schema_grammar tree(R"({"$ref": "#/$defs/node", "$defs": {"node": {"type": "object",
      "properties": {"name": {"type": "string"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}}, "required": ["name"]}}})");
    CHECK(tree.accepts(R"({"name": "a", "kids": [{"name": "b"}, {"name": "c", "kids": [{"name": "d", "kids": []}]}]})"));
    CHECK_FALSE(tree.accepts(R"({"name": "a", "kids": [{"kids": []}]})"));
    const schema_grammar any(
        R"({"anyOf": [{"type": "integer"}, {"type": "object", "properties": {"x": {"type": ["string", "null"]}}, "required": ["x"]}]})");
    CHECK(any.accepts("42"));
    CHECK(any.accepts(R"({"x": null})"));
    CHECK(any.accepts(R"({"x": "s"})"));
    CHECK_FALSE(any.accepts(R"({"x": 1})"));
    const schema_grammar f(
        R"({"type": "array", "items": {"anyOf": [{"type": "string", "format": "date-time"}, {"type": "string", "format": "uuid"}]}})");
    CHECK(f.accepts(R"(["2026-12-07T15:16:07Z", "123e4567-e89b-12d3-a456-426614174000", "2026-01-31T23:59:59.5+01:00"])"));
    CHECK_FALSE(f.accepts(R"(["2026-13-07T15:16:07Z"])"));
    const schema_grammar self(R"({"type": "object", "properties": {"next": {"$ref": "#"}}})");
    CHECK(self.accepts(R"({"next": {"next": {}}})"));
    const schema_grammar map(R"({"type": "object", "additionalProperties": {"type": "integer"}})");
    CHECK(map.accepts(R"({"a": 1, "b": 2})"));
    CHECK_FALSE(map.accepts(R"({"a": "x"})"));
    const schema_grammar whatever("{}");
    CHECK(whatever.accepts(R"([1, "a", {"b": null}])"));
    CHECK(schema_grammar("true").accepts("false"));
  }

  TEST_CASE("json_object mode takes any object, and only an object") {
    const auto g = std::make_shared<const grammar>(parse_gbnf(json_object_gbnf()));
    auto ok = [&](std::string_view t) {
      grammar_matcher m(g, byte_vocab());
      return m.accept_bytes(t) && m.accepting();
    };
    CHECK(ok(R"({"a": [1, 2, {"b": "c"}], "d": -1.5E+3})"));
    CHECK(ok(" {}"));
    CHECK_FALSE(ok("[1]"));
    CHECK_FALSE(ok(R"({"a": 1} x)"));
  }

  TEST_CASE("what is not supported is named, with where it is") {
    CHECK(error_of(R"({"type": "string", "pattern": "^a+$"})") == "JSON schema: keyword 'pattern' is not supported for type string at /");
    CHECK(error_of(R"({"type": "object", "properties": {"n": {"type": "integer", "minimum": 0}}})") ==
          "JSON schema: keyword 'minimum' is not supported for type integer at /properties/n");
    CHECK(error_of(R"({"type": "array", "uniqueItems": true})").find("'uniqueItems' is not supported") != std::string::npos);
    CHECK(error_of(R"({"type": "string", "format": "email"})").find("format 'email' is not supported") != std::string::npos);
    CHECK(error_of(R"({"allOf": [{"type": "string"}, {"maxLength": 3}]})").find("allOf of more than one") != std::string::npos);
    CHECK(error_of(R"({"$ref": "#/$defs/missing"})").find("points at nothing") != std::string::npos);
    CHECK(error_of(R"({"$ref": "https://example.com/s.json"})").find("not within this schema") != std::string::npos);
    CHECK(error_of(R"({"type": "strin"})").find("unknown type 'strin'") != std::string::npos);
    CHECK(error_of(R"({"type": "object", "properties": {"a": {}}, "required": ["b"]})").find("'b', which is not in properties") != std::string::npos);
    CHECK(error_of(R"({"type": "array", "minItems": 3, "maxItems": 2})").find("maxItems is below minItems") != std::string::npos);
    CHECK(error_of(R"({"type": "array", "maxItems": 100000})").find("above 10000") != std::string::npos);
    CHECK(error_of("false").find("matches nothing") != std::string::npos);
    CHECK(error_of("[1]").find("must be an object or a boolean") != std::string::npos);
    CHECK(error_of(R"({"not": {"type": "string"}})").find("keyword 'not' is not supported at /") != std::string::npos);
    CHECK(error_of(R"({"title": "T", "description": "d", "type": "integer"})").empty());  // annotations are fine
  }

  TEST_CASE("a schema that refers to itself without end is cut off") {
    // The schema converts (a rule that is itself); the loop, which consumes nothing, is the
    // grammar's error, and the API reports either as a 400 on the schema's field.
    CHECK(error_of(R"({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}})").empty());
    CHECK_THROWS_AS(parse_gbnf(json_schema_to_gbnf(ojson::parse(R"({"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}})"))), grammar_error);
  }
}
