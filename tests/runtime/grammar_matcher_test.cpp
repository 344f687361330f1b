#include "runtime/grammar_matcher.h"
#include "tests/runtime/grammar_test_util.h"

#include <doctest/doctest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>

#include "models/gguf_reader.h"
#include "models/tokenizer.h"
#include "runtime/json_schema.h"
#include "tests/test_support.h"

using namespace tandem;
using namespace tandem::runtime;
using ojson = nlohmann::ordered_json;

using tandem::test::byte_vocab;

namespace {

std::shared_ptr<const grammar> compile(const std::string& gbnf) { return std::make_shared<const grammar>(parse_gbnf(gbnf)); }

bool bit(const std::vector<uint64_t>& bits, int32_t id) { return (bits[static_cast<size_t>(id) / 64] >> (id % 64)) & 1; }

// A random vocabulary of JSON-ish pieces (duplicates, prefixes of each other, multi-byte
// characters split across tokens) with two end-of-generation ids and one control token.
std::shared_ptr<const grammar_vocab> random_vocab(uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::vector<std::string> atoms = {"{", "}",    "[",     "]",    "\"", ":", ",",    " ",    "\n",           "a", "b", "1", "0", "-", ".",
                                          "e", "true", "false", "null", "\\", "u", "\xC3", "\xA9", "\xE2\x9C\x93", "x"};
  std::vector<std::string> pieces;
  for (int i = 0; i < 600; ++i) {
    std::string p;
    const int n = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < n; ++k) p += atoms[rng() % atoms.size()];
    pieces.push_back(p);
  }
  pieces.push_back("");  // a control token: never allowed
  pieces.push_back("");  // eog
  pieces.push_back("");  // eog
  const auto n = static_cast<int32_t>(pieces.size());
  return std::make_shared<const grammar_vocab>(make_grammar_vocab(std::move(pieces), {n - 2, n - 1}));
}

}  // namespace

TEST_SUITE("grammar_matcher") {
  TEST_CASE("the trie walk's mask is the per-token check, step after step") {
    const auto v = random_vocab(7);
    const auto g = compile(
        json_schema_to_gbnf(ojson::parse(R"({"type": "object", "properties": {"a": {"type": "array", "items": {}}, "b": {"type": "string"}}})")));
    std::mt19937_64 rng(11);
    for (int doc = 0; doc < 3; ++doc) {
      grammar_matcher m(g, v);
      for (int step = 0; step < 80; ++step) {
        const auto bits = m.allowed();
        std::vector<int32_t> ok;
        for (int32_t t = 0; t < v->n_vocab(); ++t) {
          grammar_matcher probe = m;
          const bool accepted = probe.accept(t);
          REQUIRE_MESSAGE(accepted == bit(bits, t), "token ", t, " '", v->pieces[static_cast<size_t>(t)], "' at step ", step);
          if (accepted) ok.push_back(t);
        }
        if (ok.empty() || m.finished()) break;
        REQUIRE(m.accept(ok[rng() % ok.size()]));
      }
    }
  }

  TEST_CASE("end of generation only where the grammar may end; control tokens never") {
    const auto v = random_vocab(3);
    const int32_t eog = v->n_vocab() - 1, control = v->n_vocab() - 3;
    grammar_matcher m(compile("root ::= \"a\" \"b\"?"), v);
    CHECK_FALSE(bit(m.allowed(), eog));
    CHECK_FALSE(m.accept(eog));
    CHECK_FALSE(bit(m.allowed(), control));
    REQUIRE(m.accept_bytes("a"));
    CHECK(m.accepting());
    CHECK_FALSE(m.finished());
    CHECK(bit(m.allowed(), eog));
    CHECK(m.accept(eog));
    REQUIRE(m.accept_bytes("b"));
    CHECK(m.finished());
    CHECK_FALSE(m.accept_bytes("b"));
    CHECK(m.finished());  // a refused token changes nothing
  }

  TEST_CASE("mask sets what may not come to -inf, ids past the vocabulary too") {
    std::vector<std::string> pieces = {"a", "b", "ab", "c"};
    const auto v = std::make_shared<const grammar_vocab>(make_grammar_vocab(pieces, {}));
    grammar_matcher m(compile("root ::= \"ab\" \"c\""), v);
    std::vector<float> logits(6, 1.0f);
    CHECK(m.mask(logits));
    CHECK(logits[0] == 1.0f);
    CHECK(std::isinf(logits[1]));
    CHECK(logits[2] == 1.0f);
    CHECK(std::isinf(logits[3]));
    CHECK(std::isinf(logits[4]));
    CHECK(std::isinf(logits[5]));
    grammar_matcher stuck(compile("root ::= \"z\""), v);  // no token spells it
    std::vector<float> none(4, 0.0f);
    CHECK_FALSE(stuck.mask(none));
  }

  TEST_CASE("a grammar with more states than the matcher keeps goes on after forgetting them") {
    grammar_matcher m(compile("root ::= (\"a\"{0,10000}){2} \"b\""), byte_vocab());
    for (int i = 0; i < 20000; ++i) REQUIRE(m.accept(static_cast<int32_t>('a')));
    CHECK(m.states() < 20000);
    CHECK_FALSE(m.accept('a'));
    CHECK(m.accept('b'));
    CHECK(m.finished());
  }

  TEST_CASE("an ambiguous grammar's branches stay bounded, and its outputs stay in its language") {
    // Every 'a' may open a pair or not: the parses after n a's differ in depth.
    const auto g = compile("root ::= s\ns ::= \"a\" s \"b\" | \"a\" s | \"\"");
    grammar_matcher m(g, byte_vocab());
    for (int i = 0; i < 100; ++i) {
      std::vector<float> logits(256, 0.0f);
      REQUIRE(m.mask(logits));
      REQUIRE(m.accept('a'));
    }
    CHECK(m.accepting());
    CHECK(m.accept_bytes("bbb"));
    CHECK(m.accepting());
  }

  TEST_CASE("a deep nesting is refused past the stack bound rather than growing without end") {
    grammar_matcher m(compile("root ::= \"[\" root? \"]\""), byte_vocab());
    int depth = 0;
    while (depth < 10000 && m.accept('[')) ++depth;
    CHECK(depth > 1000);
    CHECK(depth < 10000);
  }
}

// 1,000 random steps over a real vocabulary: every token the mask allows keeps the text a
// prefix of the language (checked by a byte-at-a-time matcher, not the trie walk), and every
// document that ends parses as JSON of the schema's shape.
namespace {

void random_steps(const models::tokenizer& tok, int steps, uint64_t seed) {
  const ojson schema = ojson::parse(R"({"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"},
    "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
    "ok": {"type": "boolean"}}, "required": ["name", "age"]})");
  const auto g = compile(json_schema_to_gbnf(schema));
  const auto v = make_grammar_vocab(tok);
  std::mt19937_64 rng(seed);
  int documents = 0;
  std::string text;
  auto m = std::make_unique<grammar_matcher>(g, v);
  for (int step = 0; step < steps; ++step) {
    const auto& bits = m->allowed();
    std::vector<int32_t> ok;
    bool eog = false;
    for (int32_t t = 0; t < v->n_vocab(); ++t) {
      if (!bit(bits, t)) continue;
      if (tok.is_eog(t))
        eog = true;
      else
        ok.push_back(t);
    }
    if (eog || ok.empty()) {
      REQUIRE_MESSAGE(eog, "no token may follow '", text, "'");
      const ojson doc = ojson::parse(text);
      CHECK(doc.is_object());
      CHECK(doc["name"].is_string());
      CHECK(doc["name"].get<std::string>().size() <= 12 * 6);  // 12 characters
      CHECK(doc["age"].is_number_integer());
      if (doc.contains("tags")) CHECK(doc["tags"].size() <= 3);
      ++documents;
      text.clear();
      m = std::make_unique<grammar_matcher>(g, v);
      continue;
    }
    const int32_t t = ok[rng() % ok.size()];
    REQUIRE(m->accept(t));
    text += tok.token_to_piece(t, false);
    grammar_matcher reference(g, byte_vocab());
    REQUIRE_MESSAGE(reference.accept_bytes(text), "'", text, "' is not a prefix of the language");
  }
  CHECK(documents > 0);
  MESSAGE(documents, " documents in ", steps, " steps");
}

}  // namespace

TEST_SUITE("smollm_grammar") {
  TEST_CASE("1,000 random steps on SmolLM2's vocabulary stay in the schema's language") {
    test::require_smollm();
    models::gguf_file f(test::smollm_path().string());
    random_steps(models::tokenizer::from_gguf(f), 1000, 5);
  }
}

TEST_SUITE("grammar_matcher") {
  TEST_CASE("random steps on Qwen2's 152K vocabulary stay in the schema's language") {
    models::gguf_file f(test::data_path("vocab/ggml-vocab-qwen2.gguf").string());
    random_steps(models::tokenizer::from_gguf(f), 300, 9);
  }
}
