#include "runtime/generate.h"

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

// What the sink saw. ids holds only generated tokens (id >= 0); tail counts final flushes.
struct recorder {
  std::vector<int32_t> ids;
  std::string text;
  int tail_calls = 0;
  int64_t stop_after = -1;  // >= 0: return false on that many-th token

  runtime::token_sink sink() {
    return [this](int32_t id, const std::string& piece) {
      text += piece;
      if (id < 0) {
        ++tail_calls;
        return true;
      }
      ids.push_back(id);
      return stop_after < 0 || static_cast<int64_t>(ids.size()) < stop_after;
    };
  }
};

runtime::generate_options greedy(int64_t max_tokens) {
  runtime::generate_options o;
  o.max_tokens = max_tokens;
  o.sampling.temperature = 0.0f;
  return o;
}

std::vector<int32_t> first(const std::vector<int32_t>& v, size_t n) { return {v.begin(), v.begin() + static_cast<ptrdiff_t>(n)}; }

}  // namespace

TEST_SUITE("generate") {
  TEST_CASE("greedy stories260K streams llama.cpp's text") {
    stories s;
    REQUIRE(s.ref_ids.size() == 48);
    models::forward_context ctx(s.m, {.n_ctx = 128}, nullptr);
    recorder r;
    const auto st = runtime::generate(ctx, s.tok, s.prompt, greedy(48), r.sink());
    CHECK(r.ids == s.ref_ids);
    CHECK(r.text == s.ref_text);
    CHECK(r.tail_calls == 0);  // ASCII only: nothing held back
    CHECK(st.stop_reason == "length");
    CHECK(st.prompt_tokens == 5);
    CHECK(st.generated_tokens == 48);
    CHECK(st.prompt_seconds >= 0);
    CHECK(st.generate_seconds >= 0);
    CHECK(st.prompt_tok_s() >= 0);
    CHECK(st.generate_tok_s() >= 0);
  }

  TEST_CASE("max_tokens is respected") {
    stories s;
    for (int64_t n : {1, 7, 20}) {
      CAPTURE(n);
      models::forward_context ctx(s.m, {.n_ctx = 128}, nullptr);
      recorder r;
      const auto st = runtime::generate(ctx, s.tok, s.prompt, greedy(n), r.sink());
      CHECK(r.ids == first(s.ref_ids, static_cast<size_t>(n)));
      CHECK(st.generated_tokens == n);
      CHECK(st.stop_reason == "length");
      CHECK(s.ref_text.rfind(r.text, 0) == 0);  // a prefix of the reference text
    }
    SUBCASE("zero tokens") {
      models::forward_context ctx(s.m, {.n_ctx = 128}, nullptr);
      recorder r;
      const auto st = runtime::generate(ctx, s.tok, s.prompt, greedy(0), r.sink());
      CHECK(r.ids.empty());
      CHECK(r.text.empty());
      CHECK(st.generated_tokens == 0);
      CHECK(st.prompt_tokens == 5);
      CHECK(st.stop_reason == "length");
    }
  }

  TEST_CASE("a sink returning false stops generation") {
    stories s;
    models::forward_context ctx(s.m, {.n_ctx = 128}, nullptr);
    recorder r;
    r.stop_after = 3;
    const auto st = runtime::generate(ctx, s.tok, s.prompt, greedy(48), r.sink());
    CHECK(r.ids == first(s.ref_ids, 3));
    CHECK(st.generated_tokens == 3);
    CHECK(st.stop_reason == "callback");
  }

  TEST_CASE("end of generation") {
    // stories260K's greedy continuation never reaches its EOS (id 2) within the 128-token
    // context, so the tokenizer is rebuilt with EOS set to the 6th greedy token (which appears
    // nowhere earlier): generation must stop right before it.
    stories s;
    auto vd = models::read_vocab_data(s.m.file());
    const int32_t eos = s.ref_ids[5];
    for (size_t i = 0; i < 5; ++i) REQUIRE(s.ref_ids[i] != eos);
    vd.ids[std::string(models::k_key_eos)] = eos;
    const auto tok = models::tokenizer::from_data(vd);
    REQUIRE(tok.is_eog(eos));

    SUBCASE("stops at the EOS token without emitting it") {
      models::forward_context ctx(s.m, {.n_ctx = 128}, nullptr);
      recorder r;
      const auto st = runtime::generate(ctx, tok, s.prompt, greedy(-1), r.sink());
      CHECK(r.ids == first(s.ref_ids, 5));
      CHECK(st.generated_tokens == 5);
      CHECK(st.stop_reason == "eog");
      std::string pieces;
      for (size_t i = 0; i < 5; ++i) pieces += s.tok.token_to_piece(s.ref_ids[i]);
      CHECK(r.text == pieces);
      CHECK(s.ref_text.rfind(r.text, 0) == 0);
      CHECK(r.text.find(tok.token_to_piece(eos)) == std::string::npos);
    }
    SUBCASE("also under a max_tokens limit") {
      models::forward_context ctx(s.m, {.n_ctx = 128}, nullptr);
      recorder r;
      const auto st = runtime::generate(ctx, tok, s.prompt, greedy(48), r.sink());
      CHECK(st.generated_tokens == 5);
      CHECK(st.stop_reason == "eog");
    }
    SUBCASE("stop_at_eog false emits it and goes on") {
      models::forward_context ctx(s.m, {.n_ctx = 128}, nullptr);
      recorder r;
      auto o = greedy(8);
      o.stop_at_eog = false;
      const auto st = runtime::generate(ctx, tok, s.prompt, o, r.sink());
      CHECK(r.ids == first(s.ref_ids, 8));
      CHECK(st.stop_reason == "length");
    }
    SUBCASE("the real EOS id of the file is end of generation") {
      CHECK(s.tok.eos() == 2);
      CHECK(s.tok.is_eog(2));
      CHECK_FALSE(s.tok.is_eog(eos));
    }
  }

  TEST_CASE("a full context stops generation") {
    // Prompt of 5 in a context of 16: tokens are sampled until the cache is full; the last
    // sampled token needs no cache slot, so 16 - 5 + 1 = 12 tokens come out.
    stories s;
    models::forward_context ctx(s.m, {.n_ctx = 16}, nullptr);
    recorder r;
    const auto st = runtime::generate(ctx, s.tok, s.prompt, greedy(-1), r.sink());
    CHECK(st.stop_reason == "context");
    CHECK(st.generated_tokens == 12);
    CHECK(r.ids == first(s.ref_ids, 12));
    CHECK(ctx.pos() == ctx.n_ctx());

    SUBCASE("max_tokens beyond the context also stops there") {
      models::forward_context ctx2(s.m, {.n_ctx = 16}, nullptr);
      recorder r2;
      const auto st2 = runtime::generate(ctx2, s.tok, s.prompt, greedy(100), r2.sink());
      CHECK(st2.stop_reason == "context");
      CHECK(r2.ids == r.ids);
    }
    SUBCASE("max_tokens reached exactly when the context fills counts as length") {
      models::forward_context ctx2(s.m, {.n_ctx = 16}, nullptr);
      recorder r2;
      const auto st2 = runtime::generate(ctx2, s.tok, s.prompt, greedy(12), r2.sink());
      CHECK(st2.generated_tokens == 12);
      CHECK(st2.stop_reason == "length");
    }
  }

  TEST_CASE("prompts that cannot run are refused before any work") {
    stories s;
    models::forward_context ctx(s.m, {.n_ctx = 8}, nullptr);
    recorder r;
    SUBCASE("empty prompt") {
      CHECK_THROWS_AS(runtime::generate(ctx, s.tok, std::span<const int32_t>{}, greedy(4), r.sink()), std::invalid_argument);
    }
    SUBCASE("a prompt that fills the whole context") {
      const std::vector<int32_t> long_prompt(8, 403);
      CHECK_THROWS_AS(runtime::generate(ctx, s.tok, long_prompt, greedy(4), r.sink()), std::invalid_argument);
    }
    SUBCASE("a prompt that does not fit after what the context holds") {
      ctx.eval(s.prompt);  // 5 of 8 used
      const std::vector<int32_t> more(3, 403);
      CHECK_THROWS_AS(runtime::generate(ctx, s.tok, more, greedy(4), r.sink()), std::invalid_argument);
      CHECK(ctx.pos() == 5);
    }
    CHECK(r.ids.empty());
    CHECK(r.text.empty());
  }

  TEST_CASE("a prompt one short of the context gives two tokens") {
    stories s;
    models::forward_context ctx(s.m, {.n_ctx = 6}, nullptr);
    recorder r;
    const auto st = runtime::generate(ctx, s.tok, s.prompt, greedy(-1), r.sink());
    CHECK(st.stop_reason == "context");
    CHECK(r.ids == first(s.ref_ids, 2));
  }

  TEST_CASE("continues a prefix already in the context") {
    stories s;
    models::forward_context ctx(s.m, {.n_ctx = 128}, nullptr);
    ctx.eval(std::span<const int32_t>(s.prompt).first(3));
    recorder r;
    const auto st = runtime::generate(ctx, s.tok, std::span<const int32_t>(s.prompt).subspan(3), greedy(10), r.sink());
    CHECK(st.prompt_tokens == 2);
    CHECK(r.ids == first(s.ref_ids, 10));
  }

  TEST_CASE("seeded sampling is reproducible") {
    stories s;
    runtime::generate_options o;
    o.max_tokens = 24;
    o.sampling.temperature = 1.0f;
    o.sampling.seed = 1234;
    auto run = [&](uint64_t seed) {
      o.sampling.seed = seed;
      models::forward_context ctx(s.m, {.n_ctx = 128}, nullptr);
      recorder r;
      const auto st = runtime::generate(ctx, s.tok, s.prompt, o, r.sink());
      CHECK(st.generated_tokens == static_cast<int64_t>(r.ids.size()));
      return r.ids;
    };
    const auto a = run(1234);
    CHECK(a.size() == 24);
    CHECK(run(1234) == a);
    // Different seeds almost surely differ somewhere in 24 tokens at temperature 1.
    CHECK((run(1) != a || run(2) != a));
  }
}
