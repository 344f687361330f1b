// Speculative decoding in the engine: every proposer (n-gram lookup, predicted outputs, a
// draft model of the same or of another vocabulary) leaves greedy and seeded outputs exactly as
// they are without it, through concurrency, preemption, prefix-cache hits and stop strings;
// and sampled tokens follow the target's own distribution.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <random>

#include "memory/arbiter.h"
#include "memory/cpu_backend.h"
#include "models/synth.h"
#include "runtime/engine.h"
#include "tests/runtime/engine_test_util.h"
#include "tests/test_support.h"

using namespace tandem;
using test::alone;
using test::collect;
using test::greedy;

namespace {

// A synthetic model of the small shape on another vocabulary (GPT-2's byte-level BPE).
void write_gpt2_synth(const std::string& path, uint64_t seed) {
  models::synth_options o;
  o.dim = 64;
  o.layers = 1;
  o.heads = 2;
  o.kv_heads = 2;
  o.ffn = 128;
  o.context = 512;
  o.vocab_path = test::data_path("vocab/ggml-vocab-gpt-2.gguf").string();
  o.type = kernels::weight_type::q8_0;
  o.seed = seed;
  models::synth_model(o, path);
}

std::vector<int32_t> repeating_prompt() {
  std::vector<int32_t> prompt{1};
  for (int r = 0; r < 3; ++r)
    for (int k = 0; k < 12; ++k) prompt.push_back(static_cast<int32_t>(300 + k));
  return prompt;
}

}  // namespace

TEST_SUITE("engine") {
  TEST_CASE("speculation (n-gram lookup, predictions): greedy and seeded outputs equal those without it") {
    const models::model m(test::data_path("stories260K.gguf").string());
    const auto tok = models::tokenizer::from_gguf(m.file());
    // A prompt that repeats itself, so lookups find something to propose.
    const auto prompt = repeating_prompt();
    runtime::engine_model em{"m", &m, &tok, 0, 4, 256};
    em.speculate = {runtime::spec_method::ngram, 6};
    runtime::engine spec({em}, {.threads = 2, .max_batch_tokens = 64, .prefill_chunk = 16});
    runtime::engine plain({{"m", &m, &tok, 0, 4, 256}}, {.threads = 2, .max_batch_tokens = 64, .prefill_chunk = 16});
    const auto want = collect(*plain.submit({"m", prompt, greedy(60)}));
    CHECK(want == alone(m, tok, prompt, 60));
    CHECK(collect(*spec.submit({"m", prompt, greedy(60)})) == want);
    // A prediction of the answer itself (all accepted), and one that is wrong half way.
    auto predicted = greedy(60);
    predicted.prediction = want;
    auto h = spec.submit({"m", prompt, predicted});
    CHECK(collect(*h) == want);
    CHECK(h->speculation().accepted > 40);
    predicted.prediction = std::vector<int32_t>(want.begin(), want.begin() + 30);
    for (int i = 0; i < 10; ++i) predicted.prediction.push_back(7);
    CHECK(collect(*spec.submit({"m", prompt, predicted})) == want);
    // Seeded sampling: one draw per token in the same order, so the same tokens.
    auto sampled = greedy(60);
    sampled.sampling.temperature = 0.9f;
    sampled.sampling.seed = 77;
    const auto want_sampled = collect(*plain.submit({"m", prompt, sampled}));
    CHECK(collect(*spec.submit({"m", prompt, sampled})) == want_sampled);
    // Several at once, with speculation turned off for one.
    std::vector<std::shared_ptr<runtime::request_handle>> hs;
    for (int i = 0; i < 4; ++i) {
      auto p = greedy(60);
      p.speculate = i != 2;
      hs.push_back(spec.submit({"m", prompt, p}));
    }
    for (auto& x : hs) CHECK(collect(*x) == want);
    spec.drain();
    const auto st = spec.stats("m");
    CHECK(st.spec_proposed > 0);
    CHECK(st.spec_accepted > 0);
    CHECK(st.spec_tokens > st.spec_passes);  // more than one token a verifying pass
    CHECK(spec.kv_blocks_in_use("m") == 0);
  }

  TEST_CASE("logprobs come with every token, the same with speculation as without") {
    const models::model m(test::data_path("stories260K.gguf").string());
    const auto tok = models::tokenizer::from_gguf(m.file());
    const auto prompt = repeating_prompt();
    runtime::engine_model em{"m", &m, &tok, 0, 2, 256};
    em.speculate = {runtime::spec_method::ngram, 6};
    runtime::engine spec({em}, {.threads = 2, .max_batch_tokens = 64, .prefill_chunk = 16});
    runtime::engine plain({{"m", &m, &tok, 0, 2, 256}}, {.threads = 2, .max_batch_tokens = 64, .prefill_chunk = 16});
    auto p = greedy(40);
    p.logprobs = 2;
    auto pieces = [&](runtime::engine& e) {
      std::vector<runtime::piece> out;
      auto h = e.submit({"m", prompt, p});
      for (runtime::piece x; h->next(&x);)
        if (x.token >= 0) out.push_back(x);
      return out;
    };
    const auto a = pieces(plain), b = pieces(spec);
    REQUIRE(a.size() == 40);
    REQUIRE(b.size() == a.size());
    for (size_t i = 0; i < a.size(); ++i) {
      CAPTURE(i);
      REQUIRE(a[i].logprob);
      REQUIRE(b[i].logprob);
      CHECK(a[i].token == b[i].token);
      CHECK(a[i].logprob->top.size() == 2);
      CHECK(a[i].logprob->top[0].first == a[i].token);  // greedy: the most likely
      CHECK(b[i].logprob->logprob == doctest::Approx(a[i].logprob->logprob).epsilon(1e-4));
    }
    auto bad = greedy(4);
    bad.logprobs = 21;
    CHECK_THROWS_AS(plain.submit({"m", prompt, bad}), std::invalid_argument);
  }

  TEST_CASE("the n-gram cache proposes from earlier requests' outputs; output unchanged, nothing kept with it off") {
    const models::model m(test::data_path("stories260K.gguf").string());
    const auto tok = models::tokenizer::from_gguf(m.file());
    const auto prompt = tok.encode("Once upon a time, there was a little dog", true, false);
    const runtime::engine_config ec{.threads = 2, .max_batch_tokens = 64, .prefill_chunk = 16, .prefix_cache = false};
    runtime::engine plain({{"m", &m, &tok, 0, 2, 256}}, ec);
    const auto want = collect(*plain.submit({"m", prompt, greedy(48)}));
    // The same request twice: the second finds the first's output in the cache.
    auto accepted_second = [&](bool cache) {
      runtime::engine_model em{"m", &m, &tok, 0, 2, 256};
      em.speculate = {runtime::spec_method::ngram, 8, cache};
      runtime::engine spec({em}, ec);
      CHECK(collect(*spec.submit({"m", prompt, greedy(48)})) == want);
      auto h = spec.submit({"m", prompt, greedy(48)});
      CHECK(collect(*h) == want);
      return h->speculation().accepted;
    };
    const int64_t with = accepted_second(true), without = accepted_second(false);
    CHECK(with > without + 20);
    CHECK(with >= 40);  // nearly every token after the first came from the cache
  }

  TEST_CASE("a draft model of the same vocabulary: greedy and seeded outputs unchanged, several at once, guesses accepted") {
    test::scratch_dir dir;
    const auto tpath = (dir / "t.gguf").string(), dpath = (dir / "d.gguf").string();
    test::write_small_synth(tpath, kernels::weight_type::q8_0, 11);
    test::write_small_synth(dpath, kernels::weight_type::q4_0, 11);  // the same weights, coarser
    const models::model target(tpath), draft(dpath);
    const auto ttok = models::tokenizer::from_gguf(target.file());
    const auto dtok = models::tokenizer::from_gguf(draft.file());
    runtime::engine_model t{"t", &target, &ttok, 0, 4, 256};
    t.speculate = {runtime::spec_method::draft, 6};
    t.draft = "d";
    runtime::engine spec({t, {"d", &draft, &dtok, 0, 4, 256}}, {.threads = 2, .max_batch_tokens = 64, .prefill_chunk = 16});
    runtime::engine plain({{"t", &target, &ttok, 0, 4, 256}}, {.threads = 2, .max_batch_tokens = 64, .prefill_chunk = 16});
    std::mt19937 rng(3);
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 4; ++i) {
      std::vector<int32_t> p{1};
      for (int k = 0; k < 5 + 11 * i; ++k) p.push_back(static_cast<int32_t>(10 + rng() % 400));
      prompts.push_back(p);
    }
    std::vector<std::shared_ptr<runtime::request_handle>> hs;
    for (const auto& p : prompts) hs.push_back(spec.submit({"t", p, greedy(48)}));
    for (size_t i = 0; i < prompts.size(); ++i) {
      CAPTURE(i);
      CHECK(collect(*hs[i]) == collect(*plain.submit({"t", prompts[i], greedy(48)})));
    }
    auto sampled = greedy(48);
    sampled.sampling.temperature = 0.8f;
    sampled.sampling.seed = 5;
    CHECK(collect(*spec.submit({"t", prompts[1], sampled})) == collect(*plain.submit({"t", prompts[1], sampled})));
    spec.drain();
    const auto st = spec.stats("t");
    CHECK(st.spec_proposed > 0);
    CHECK(st.spec_accepted * 3 > st.spec_proposed);  // the same weights, coarser: often the same argmax
    CHECK(st.draft_seconds > 0);
    CHECK(spec.kv_blocks_in_use("t") == 0);
    CHECK(spec.kv_blocks_in_use("d") == 0);  // the mirrors' KV went back with their sequences
    // The draft still serves requests of its own.
    CHECK(collect(*spec.submit({"d", prompts[0], greedy(8)})) == alone(draft, dtok, prompts[0], 8));
  }

  TEST_CASE("a draft of another vocabulary proposes through text: the target's exact greedy output") {
    test::scratch_dir dir;
    const auto dpath = (dir / "gpt2.gguf").string();
    write_gpt2_synth(dpath, 4);
    const models::model target(test::data_path("stories260K.gguf").string()), draft(dpath);
    const auto ttok = models::tokenizer::from_gguf(target.file());
    const auto dtok = models::tokenizer::from_gguf(draft.file());
    runtime::engine_model t{"t", &target, &ttok, 0, 4, 256};
    t.speculate = {runtime::spec_method::draft, 4};
    t.draft = "d";
    runtime::engine spec({t, {"d", &draft, &dtok, 0, 4, 256}}, {.threads = 2, .max_batch_tokens = 64, .prefill_chunk = 16});
    const auto prompt = ttok.encode("Once upon a time, there was a little girl named Lily. She", true, false);
    std::vector<std::shared_ptr<runtime::request_handle>> hs;
    for (int i = 0; i < 2; ++i) hs.push_back(spec.submit({"t", prompt, greedy(40)}));
    const auto want = alone(target, ttok, prompt, 40);
    for (auto& h : hs) CHECK(collect(*h) == want);
    spec.drain();
    CHECK(spec.stats("t").spec_proposed > 0);
    CHECK(spec.kv_blocks_in_use("d") == 0);
  }

  TEST_CASE("speculation through preemption, prefix-cache hits and stop strings: outputs unchanged") {
    const models::model m(test::data_path("stories260K.gguf").string());
    const models::model d(test::data_path("stories260K-q8_0.gguf").string());
    const auto tok = models::tokenizer::from_gguf(m.file());
    const auto block = static_cast<size_t>(models::kv_bytes_per_token(m.config(), kernels::cpu::kv_type::f16) * 16);
    std::vector<std::vector<int32_t>> prompts;
    const auto shared = repeating_prompt();
    for (int i = 0; i < 6; ++i) {
      auto p = shared;  // a shared prefix: later admissions adopt its cached blocks
      for (int k = 0; k < 3 + 5 * i; ++k) p.push_back(static_cast<int32_t>(40 + (k * 13 + i) % 300));
      prompts.push_back(p);
    }
    for (const auto method : {runtime::spec_method::ngram, runtime::spec_method::draft}) {
      CAPTURE(static_cast<int>(method));
      auto backend = memory::make_cpu_backend();
      memory::arbiter a(*backend, {64 << 20, uint64_t{64} << 20});
      auto pool = memory::kv_pool::make(a, "m", 12, 16, block);  // 192 positions for 3 x ~100
      REQUIRE(pool);
      // Three slots for six requests: the later ones start after earlier ones left their blocks.
      runtime::engine_model em{"m", &m, &tok, 0, 3, 128, kernels::cpu::kv_type::f16, nullptr, pool.get()};
      em.speculate = {method, 6};
      if (method == runtime::spec_method::draft) em.draft = "d";
      std::vector<runtime::engine_model> ms{em};
      if (method == runtime::spec_method::draft) ms.push_back({"d", &d, &tok, 0, 6, 128});
      runtime::engine e(ms, {.threads = 2, .max_batch_tokens = 64, .prefill_chunk = 16});
      std::vector<std::shared_ptr<runtime::request_handle>> hs;
      for (const auto& p : prompts) hs.push_back(e.submit({"m", p, greedy(60)}));
      for (size_t i = 0; i < hs.size(); ++i) {
        CAPTURE(i);
        CHECK(collect(*hs[i]) == alone(m, tok, prompts[i], 60));
      }
      e.drain();
      CHECK(e.preemptions() > 0);
      CHECK(e.prefix_tokens_reused() > 0);
      CHECK(e.stats("m").spec_accepted > 0);
      CHECK(e.kv_blocks_in_use("m") == 0);
      pool->check();
      a.check_integrity();
      // A stop string inside what speculation would accept: the text ends before it.
      const auto want = alone(m, tok, prompts[0], 60);
      const std::string text = tok.decode(want, false);
      const std::string stop(std::string_view(text).substr(text.size() / 2, 4));
      auto p = greedy(60);
      p.stop = {stop};
      auto h = e.submit({"m", prompts[0], p});
      std::string got;
      runtime::piece pc;
      while (h->next(&pc, std::chrono::seconds(60))) got += pc.text;
      CHECK(h->finished() == runtime::finish_reason::stop);
      CHECK(got == std::string_view(text).substr(0, text.find(stop)));
      e.drain();
    }
  }

  TEST_CASE("speculative sampling draws from the target's distribution (token frequencies over 600 seeds)") {
    // Row 1 of a verifying pass (the token after the first) checks a predicted token. Over
    // many seeds, the second token's frequencies among runs whose first token is the most
    // common one must match the target's softmax for that context, whatever was predicted.
    const models::model m(test::data_path("stories260K.gguf").string());
    const auto tok = models::tokenizer::from_gguf(m.file());
    runtime::engine_model em{"m", &m, &tok, 0, 8, 256};
    em.speculate = {runtime::spec_method::ngram, 4};
    runtime::engine spec({em}, {.threads = 2, .max_batch_tokens = 64, .prefill_chunk = 16});
    runtime::engine plain({{"m", &m, &tok, 0, 8, 256}}, {.threads = 2, .max_batch_tokens = 64, .prefill_chunk = 16});
    const std::vector<int32_t> prompt = tok.encode("Once upon a time", true, false);
    auto params = [&](uint64_t seed) {
      auto p = greedy(2);
      p.sampling = {.temperature = 1.0f, .top_k = 0, .top_p = 1.0f, .min_p = 0.0f, .seed = seed};
      return p;
    };
    // The most likely first token, and the target's distribution after it.
    models::forward_context ctx(m, {.n_ctx = 64}, nullptr);
    ctx.set_prompt_end(0, std::numeric_limits<int64_t>::max());
    ctx.eval(prompt);
    auto first_logits = std::vector<float>(ctx.logits().begin(), ctx.logits().end());
    const auto first = static_cast<int32_t>(std::max_element(first_logits.begin(), first_logits.end()) - first_logits.begin());
    const int32_t one[1] = {first};
    ctx.eval(one);
    std::vector<double> p(ctx.logits().begin(), ctx.logits().end());
    const double top = *std::max_element(p.begin(), p.end());
    double sum = 0;
    for (auto& x : p) sum += (x = std::exp(x - top));
    for (auto& x : p) x /= sum;
    // A prediction of [first, likely second] makes every run verify its second token.
    const auto second_guess = static_cast<int32_t>(std::max_element(p.begin(), p.end()) - p.begin());
    std::map<int32_t, int> counts;
    int n = 0, same = 0;
    constexpr int k_seeds = 600;
    for (uint64_t seed = 1; seed <= k_seeds; ++seed) {
      auto q = params(seed);
      q.prediction = {first, second_guess};
      auto h = spec.submit({"m", prompt, q});
      const auto got = collect(*h);
      same += got == collect(*plain.submit({"m", prompt, params(seed)}));
      if (got.size() == 2 && got[0] == first) {
        ++counts[got[1]];
        ++n;
      }
    }
    CHECK(same == k_seeds);  // the same seed, the same tokens
    REQUIRE(n > 100);
    // The five likeliest tokens and the rest as six buckets: each observed frequency within
    // 4 standard deviations of the exact probability, and the total variation distance
    // small. A sampler that favoured the guess would put its excess on the first bucket.
    std::vector<int32_t> order(p.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
    std::partial_sort(order.begin(), order.begin() + 5, order.end(),
                      [&](int32_t x, int32_t y) { return p[static_cast<size_t>(x)] > p[static_cast<size_t>(y)]; });
    CHECK(order[0] == second_guess);
    double tv = 0, rest_p = 1;
    int rest_n = n;
    CAPTURE(n);
    for (int b = 0; b < 6; ++b) {
      double pb = 0;
      int nb = 0;
      if (b < 5) {
        pb = p[static_cast<size_t>(order[static_cast<size_t>(b)])];
        nb = counts[order[static_cast<size_t>(b)]];
        rest_p -= pb;
        rest_n -= nb;
      } else {
        pb = rest_p;
        nb = rest_n;
      }
      const double f = static_cast<double>(nb) / n;
      CAPTURE(b);
      CAPTURE(pb);
      CAPTURE(f);
      CHECK(std::abs(f - pb) <= 4 * std::sqrt(pb * (1 - pb) / n) + 1e-9);
      tv += std::abs(f - pb) / 2;
    }
    CHECK(tv < 0.12);
  }
}
