// Perplexity as llama-perplexity computes it: chunks from an empty cache, BOS first, the second
// half of each chunk scored.
#include "runtime/perplexity.h"

#include <doctest/doctest.h>

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/forward.h"
#include "models/tokenizer.h"
#include "tests/test_support.h"

using namespace tandem;

namespace {

const char* k_story =
    "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. One day, she saw a big tree with "
    "a swing. She ran to the swing and sat on it. She swung high and low. Lily was very happy. Then she saw a little dog. The dog "
    "was sad because it lost its ball. Lily wanted to help the dog. She looked under the tree and found the ball. She gave the "
    "ball to the dog. The dog was happy and wagged its tail. Lily and the dog played together all day. When the sun went down, "
    "Lily went home. She told her mom about the dog. Her mom smiled and gave her a big hug.";

}  // namespace

TEST_SUITE("perplexity") {
  TEST_CASE("a chunk's score is -log softmax of the next token, from BOS and an empty cache") {
    const models::model m(test::data_path("stories260K.gguf").string());
    const auto tok = models::tokenizer::from_gguf(m.file());
    const std::vector<int32_t> ids = {7, 403, 407, 300, 261, 378, 432, 301};  // two chunks of 4
    const auto r = runtime::perplexity(m, ids, tok.bos(), {.n_ctx = 4, .kv = kernels::cpu::kv_type::f32}, nullptr);
    CHECK(r.chunks == 2);
    CHECK(r.scored == 2);  // position 2 of each chunk predicts position 3
    REQUIRE(r.running.size() == 2);
    double want = 0;
    struct scored {
      std::vector<int32_t> context;
      int32_t next;
    };
    for (const auto& [context, next] : {scored{{tok.bos(), 403, 407}, 300}, scored{{tok.bos(), 378, 432}, 301}}) {
      models::forward_context ctx(m, {.n_ctx = 4, .kv = kernels::cpu::kv_type::f32}, nullptr);
      ctx.eval(context);
      const auto l = ctx.logits();
      double z = 0;
      for (const float v : l) z += std::exp(static_cast<double>(v));
      want += std::log(z) - l[static_cast<size_t>(next)];
    }
    CHECK(r.mean_nll == doctest::Approx(want / 2).epsilon(1e-6));
    CHECK(r.ppl == doctest::Approx(std::exp(want / 2)).epsilon(1e-6));
  }

  TEST_CASE("text the model writes scores far better than shuffled text; the KV types agree") {
    const models::model m(test::data_path("stories260K.gguf").string());
    const auto tok = models::tokenizer::from_gguf(m.file());
    const auto ids = tok.encode(k_story, true, false);
    REQUIRE(ids.size() >= 128);
    const auto f16 = runtime::perplexity(m, ids, tok.bos(), {.n_ctx = 64}, nullptr);
    const auto f32 = runtime::perplexity(m, ids, tok.bos(), {.n_ctx = 64, .kv = kernels::cpu::kv_type::f32}, nullptr);
    auto shuffled = ids;
    for (size_t i = 1; i < shuffled.size(); ++i) shuffled[i] = ids[(i * 37) % ids.size()];
    const auto noise = runtime::perplexity(m, shuffled, tok.bos(), {.n_ctx = 64}, nullptr);
    CHECK(f16.chunks == static_cast<int64_t>(ids.size()) / 64);
    CHECK(f16.scored == f16.chunks * 31);
    CHECK(f16.ppl > 1.0);
    CHECK(f16.ppl < 10.0);
    CHECK(noise.ppl > 4 * f16.ppl);
    CHECK(f16.ppl == doctest::Approx(f32.ppl).epsilon(0.01));
    CHECK(f16.ppl_error > 0);
    CHECK(f16.ppl_error < f16.ppl);
    const auto one = runtime::perplexity(m, ids, tok.bos(), {.n_ctx = 64, .max_chunks = 1}, nullptr);
    CHECK(one.chunks == 1);
    CHECK(one.running.front() == doctest::Approx(f16.running.front()));
  }

  TEST_CASE("a chunk of fewer than 2 tokens, or a text shorter than one chunk, is refused") {
    const models::model m(test::data_path("stories260K.gguf").string());
    const std::vector<int32_t> ids(10, 300);
    CHECK_THROWS_AS(runtime::perplexity(m, ids, 1, {.n_ctx = 1}, nullptr), std::invalid_argument);
    CHECK_THROWS_AS(runtime::perplexity(m, ids, 1, {.n_ctx = 64}, nullptr), std::invalid_argument);
  }
}
