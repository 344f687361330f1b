// Constrained decoding in the engine: sampled outputs of a grammar stay in its language and end
// where it is complete, beside unconstrained requests in the same passes.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "runtime/engine.h"
#include "runtime/json_schema.h"
#include "tests/runtime/engine_test_util.h"
#include "tests/test_support.h"

using namespace tandem;

namespace {

struct outcome {
  std::string text;
  runtime::finish_reason reason = runtime::finish_reason::none;
  size_t tokens = 0;
};

outcome read_all(runtime::request_handle& h) {
  outcome o;
  runtime::piece p;
  while (h.next(&p, std::chrono::seconds(60))) {
    o.text += p.text;
    o.tokens += p.token >= 0;
  }
  o.reason = h.finished();
  return o;
}

runtime::generation_params sampled(uint64_t seed, std::shared_ptr<const runtime::grammar> g) {
  runtime::generation_params p;
  p.max_tokens = 120;
  p.sampling.temperature = 1.0f;
  p.sampling.top_k = 0;
  p.sampling.top_p = 1.0f;
  p.sampling.min_p = 0;
  p.sampling.seed = seed;
  p.constraint = std::move(g);
  return p;
}

}  // namespace

TEST_SUITE("engine") {
  TEST_CASE("a grammar's outputs are in its language and stop once complete, beside free requests") {
    const models::model m(test::data_path("stories260K.gguf").string());
    const auto tok = models::tokenizer::from_gguf(m.file());
    runtime::engine_model em{"m", &m, &tok, 0, 8, 256};
    em.speculate = {runtime::spec_method::ngram, 4};  // speculation is off for constrained requests
    runtime::engine e({em}, {.threads = 2, .max_batch_tokens = 128, .prefill_chunk = 32});
    const auto schema = nlohmann::ordered_json::parse(R"({"type": "object", "properties": {
      "name": {"type": "string", "maxLength": 8}, "n": {"type": "integer"}, "ok": {"type": "boolean"}},
      "required": ["name", "n"]})");
    const auto g = std::make_shared<const runtime::grammar>(runtime::parse_gbnf(runtime::json_schema_to_gbnf(schema)));
    const auto prompt = tok.encode("Once upon a time", true, false);
    std::vector<std::shared_ptr<runtime::request_handle>> hs;
    for (uint64_t seed = 1; seed <= 6; ++seed) hs.push_back(e.submit({"m", prompt, sampled(seed, g)}));
    const auto free_one = e.submit({"m", prompt, test::greedy(20)});
    int complete = 0;
    for (auto& h : hs) {
      const outcome o = read_all(*h);
      if (o.reason == runtime::finish_reason::length) continue;  // cut off: a prefix (checked below)
      CHECK_MESSAGE((o.reason == runtime::finish_reason::stop || o.reason == runtime::finish_reason::eog), o.text);
      const auto doc = nlohmann::json::parse(o.text, nullptr, false);
      REQUIRE_MESSAGE(!doc.is_discarded(), o.text);
      CHECK(doc["name"].is_string());
      CHECK(doc["n"].is_number_integer());
      ++complete;
    }
    CHECK(complete >= 3);
    CHECK(read_all(*free_one).tokens == 20);
  }

  TEST_CASE("a grammar that ignores end-of-generation tokens still ends where it is complete") {
    const models::model m(test::data_path("stories260K.gguf").string());
    const auto tok = models::tokenizer::from_gguf(m.file());
    runtime::engine e({{"m", &m, &tok, 0, 2, 256}}, {.threads = 2});
    auto p = test::greedy(50);  // stop_at_eog false
    p.constraint = std::make_shared<const runtime::grammar>(runtime::parse_gbnf(R"(root ::= " Lily" (" and" " Tom")? ".")"));
    const outcome o = read_all(*e.submit({"m", tok.encode("Once upon a time, there was a girl named", true, false), p}));
    CHECK((o.text == " Lily." || o.text == " Lily and Tom."));
    CHECK(o.reason == runtime::finish_reason::stop);
  }

  TEST_CASE("bytes no ordinary token holds come from byte tokens") {
    const models::model m(test::data_path("stories260K.gguf").string());
    const auto tok = models::tokenizer::from_gguf(m.file());
    runtime::engine e({{"m", &m, &tok, 0, 2, 256}}, {.threads = 2});
    auto p = test::greedy(10);
    p.constraint = std::make_shared<const runtime::grammar>(runtime::parse_gbnf("root ::= \"\\u0001\\u00e9\""));
    const outcome o = read_all(*e.submit({"m", tok.encode("Once", true, false), p}));
    CHECK(o.text == "\x01\xC3\xA9");
    CHECK(o.reason == runtime::finish_reason::stop);
  }
}
