// A one-request engine, as `tandem run` drives it: llama.cpp's tokens with the request's
// exact arithmetic, and the stop conditions of a single generation.
#include "runtime/engine.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>
#include <vector>

#include "models/vocab.h"
#include "tests/test_support.h"

using namespace tandem;

namespace {

struct stories {
  models::model m{test::data_path("stories260K.gguf").string()};
  models::tokenizer tok = models::tokenizer::from_gguf(m.file());
  nlohmann::json ref = nlohmann::json::parse(test::read_file(test::data_path("reference/stories260K-greedy.json")));
  std::vector<int32_t> prompt = ref["prompt_ids_with_bos"].get<std::vector<int32_t>>();
  std::vector<int32_t> ref_ids = ref["generated_ids"].get<std::vector<int32_t>>();
  std::string ref_text = ref["generated_text"].get<std::string>();
};

// What a request streamed and how it ended.
struct outcome {
  std::vector<int32_t> ids;
  std::string text;
  runtime::finish_reason why = runtime::finish_reason::none;
};

// One request through an engine of one sequence of n_ctx positions (as `tandem run` makes it).
outcome run_one(const models::model& m, const models::tokenizer& tok, const std::vector<int32_t>& prompt, runtime::generation_params p,
                int64_t n_ctx = 128) {
  runtime::engine_model em;
  em.name = "one";
  em.model = &m;
  em.tokenizer = &tok;
  em.max_sequences = 1;
  em.context = n_ctx;
  runtime::engine_config ec;
  ec.threads = 2;
  ec.max_batch_tokens = ec.prefill_chunk = 512;
  ec.prefix_cache = false;
  runtime::engine eng({em}, ec);
  p.exact = true;
  auto h = eng.submit({"one", prompt, p});
  outcome o;
  runtime::piece pc;
  while (h->next(&pc, std::chrono::seconds(60))) {
    o.text += pc.text;
    if (pc.token >= 0) o.ids.push_back(pc.token);
  }
  o.why = h->finished();
  return o;
}

runtime::generation_params greedy(int64_t n) {
  runtime::generation_params p;
  p.max_tokens = n;
  p.sampling.temperature = 0;
  return p;
}

std::vector<int32_t> first(const std::vector<int32_t>& v, size_t n) { return {v.begin(), v.begin() + static_cast<ptrdiff_t>(n)}; }

}  // namespace

TEST_SUITE("engine_single") {
  TEST_CASE("greedy stories260K streams llama.cpp's text") {
    stories s;
    REQUIRE(s.ref_ids.size() == 48);
    const auto o = run_one(s.m, s.tok, s.prompt, greedy(48));
    CHECK(o.ids == s.ref_ids);
    CHECK(o.text == s.ref_text);
    CHECK(o.why == runtime::finish_reason::length);
    SUBCASE("zero tokens") {
      const auto z = run_one(s.m, s.tok, s.prompt, greedy(0));
      CHECK(z.ids.empty());
      CHECK(z.why == runtime::finish_reason::length);
    }
  }

  TEST_CASE("end of generation") {
    // stories260K's greedy continuation never reaches its EOS within the context, so the
    // tokenizer is rebuilt with EOS set to the 6th greedy token (which appears nowhere
    // earlier): generation must stop right before it.
    stories s;
    auto vd = models::read_vocab_data(s.m.file());
    const int32_t eos = s.ref_ids[5];
    for (size_t i = 0; i < 5; ++i) REQUIRE(s.ref_ids[i] != eos);
    vd.ids[std::string(models::k_key_eos)] = eos;
    const auto tok = models::tokenizer::from_data(vd);
    REQUIRE(tok.is_eog(eos));
    auto o = run_one(s.m, tok, s.prompt, greedy(48));
    CHECK(o.ids == first(s.ref_ids, 5));
    CHECK(o.why == runtime::finish_reason::eog);
    CHECK(s.ref_text.rfind(o.text, 0) == 0);
    CHECK(o.text.find(tok.token_to_piece(eos)) == std::string::npos);
    auto p = greedy(8);
    p.stop_at_eog = false;  // emits it and goes on
    o = run_one(s.m, tok, s.prompt, p);
    CHECK(o.ids == first(s.ref_ids, 8));
    CHECK(o.why == runtime::finish_reason::length);
  }

  TEST_CASE("a full context stops generation") {
    // Prompt of 5 in a context of 16: tokens are sampled until the cache is full; the last
    // sampled token needs no cache slot, so 16 - 5 + 1 = 12 tokens come out.
    stories s;
    auto o = run_one(s.m, s.tok, s.prompt, greedy(100), 16);
    CHECK(o.why == runtime::finish_reason::context);
    CHECK(o.ids == first(s.ref_ids, 12));
    o = run_one(s.m, s.tok, s.prompt, greedy(100), 6);  // one short of the context: two tokens
    CHECK(o.ids == first(s.ref_ids, 2));
  }

  TEST_CASE("prompts that cannot run are refused before any work") {
    stories s;
    CHECK_THROWS_AS(run_one(s.m, s.tok, {}, greedy(4), 8), std::invalid_argument);
    CHECK_THROWS_AS(run_one(s.m, s.tok, std::vector<int32_t>(8, 403), greedy(4), 8), std::invalid_argument);
  }

  TEST_CASE("seeded sampling is reproducible") {
    stories s;
    auto p = greedy(24);
    p.sampling.temperature = 1.0f;
    p.sampling.seed = 1234;
    const auto a = run_one(s.m, s.tok, s.prompt, p);
    const auto b = run_one(s.m, s.tok, s.prompt, p);
    p.sampling.seed = 99;
    const auto c = run_one(s.m, s.tok, s.prompt, p);
    CHECK(a.ids == b.ids);
    CHECK(a.ids != c.ids);
  }
}
