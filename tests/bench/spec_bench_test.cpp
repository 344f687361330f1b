// bench/spec_bench: plain and speculative decode of one request on the committed test models,
// with each proposer; the JSON keys the issue names; options it refuses.
#include "bench/spec_bench.h"

#include <doctest/doctest.h>

#include <stdexcept>

#include "tests/test_support.h"

using namespace tandem;

namespace {
bench::spec_bench_options small(bench::spec_bench_method m) {
  bench::spec_bench_options o;
  o.model_path = test::data_path("stories260K.gguf").string();
  o.method = m;
  o.prompt = "Once upon a time, there was a little girl named Lily. She loved to play outside.";
  o.chat = false;
  o.gen = 48;
  o.reps = 2;
  o.threads = 2;
  return o;
}
}  // namespace

TEST_SUITE("bench_spec") {
  TEST_CASE("each proposer: outputs identical to plain decode, figures in range, the issue's JSON keys") {
    SUBCASE("ngram") {
      const auto r = bench::run_spec_bench(small(bench::spec_bench_method::ngram));
      CHECK(r.identical);
      CHECK(r.method == "ngram");
      CHECK(r.generated > 1);
      CHECK(r.decode_tok_s_plain.count == 2);
      CHECK(r.decode_tok_s_plain.median > 0);
      CHECK(r.decode_tok_s_spec.median > 0);
      CHECK(r.speedup.median > 0);
      CHECK(r.acceptance_rate >= 0);
      CHECK(r.acceptance_rate <= 1);
      CHECK(r.tokens_per_pass >= 1);
      CHECK(r.draft_ms_per_token == 0);
      const auto j = bench::to_json(r);
      for (const char* k :
           {"decode_tok_s_plain", "decode_tok_s_spec", "speedup", "acceptance_rate", "tokens_per_pass", "draft_ms_per_token", "identical"})
        CHECK_MESSAGE(j.contains(k), k);
      CHECK(j["identical"].get<bool>());
      CHECK(bench::format_table(r).find("outputs identical") != std::string::npos);
    }
    SUBCASE("prediction: the answer's own text predicted is mostly accepted") {
      auto o = small(bench::spec_bench_method::prediction);
      o.prediction = " She";
      const auto first = bench::run_spec_bench(o);
      CHECK(first.identical);
      CHECK(first.prediction_tokens > 0);
      // What the model writes after this prompt, predicted: nearly every guess holds.
      o.prediction = first.output;
      const auto r = bench::run_spec_bench(o);
      CHECK(r.identical);
      CHECK(r.output == first.output);
      CHECK(r.acceptance_rate > 0.8);
      CHECK(r.tokens_per_pass > 2);
      CHECK(bench::to_json(r).contains("prediction_tokens"));
    }
    SUBCASE("a draft of the same vocabulary: guesses accepted, the draft's time counted") {
      auto o = small(bench::spec_bench_method::draft);
      o.draft_path = test::data_path("stories260K-q8_0.gguf").string();
      // Guessing only what pays: a draft that costs about what the target does is seldom asked.
      CHECK(bench::run_spec_bench(o).identical);
      o.cost_aware = false;  // the whole window every pass: the pair's own acceptance
      const auto r = bench::run_spec_bench(o);
      CHECK(r.identical);
      CHECK_FALSE(r.cost_aware);
      CHECK(r.same_vocabulary);
      CHECK(r.acceptance_rate > 0.5);  // the same weights in Q8_0: nearly always the same argmax
      CHECK(r.tokens_per_pass > 1.5);
      CHECK(r.draft_ms_per_token > 0);
      CHECK(bench::to_json(r)["draft"] == "stories260K-q8_0.gguf");
    }
  }

  TEST_CASE("refused: a draft method without a draft, a draft for another method, nothing to predict, options out of range") {
    auto o = small(bench::spec_bench_method::draft);
    CHECK_THROWS_AS(bench::run_spec_bench(o), std::invalid_argument);
    o = small(bench::spec_bench_method::ngram);
    o.draft_path = test::data_path("stories260K.gguf").string();
    CHECK_THROWS_AS(bench::run_spec_bench(o), std::invalid_argument);
    o = small(bench::spec_bench_method::prediction);  // no prediction, and no ``` block in the prompt
    CHECK_THROWS_WITH_AS(bench::run_spec_bench(o), doctest::Contains("fenced block"), std::invalid_argument);
    o = small(bench::spec_bench_method::ngram);
    o.gen = 1;
    CHECK_THROWS_AS(bench::run_spec_bench(o), std::invalid_argument);
    o = small(bench::spec_bench_method::ngram);
    o.max_draft = 33;
    CHECK_THROWS_AS(bench::run_spec_bench(o), std::invalid_argument);
  }
}

TEST_SUITE("smollm_bench_spec") {
  TEST_CASE("SmolLM2 in the engine's arithmetic: the built-in requests with each proposer decode exactly as without") {
    test::require_smollm();
    for (const auto m : {bench::spec_bench_method::prediction, bench::spec_bench_method::ngram, bench::spec_bench_method::draft}) {
      CAPTURE(bench::spec_bench_method_name(m));
      bench::spec_bench_options o;
      o.model_path = test::smollm_path().string();
      o.method = m;
      if (m == bench::spec_bench_method::draft) o.draft_path = test::data_path("stories260K.gguf").string();  // another vocabulary
      o.gen = 64;
      o.reps = 1;
      o.threads = 2;
      const auto r = bench::run_spec_bench(o);
      CHECK(r.identical);
      CHECK(r.generated == 64);
      if (m == bench::spec_bench_method::draft) CHECK_FALSE(r.same_vocabulary);
      // The answer repeats the code it was given: most predicted tokens hold.
      if (m == bench::spec_bench_method::prediction) CHECK(r.acceptance_rate > 0.5);
    }
  }
}
