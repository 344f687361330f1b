#include "models/forward.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <span>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "memory/arbiter.h"
#include "memory/cpu_backend.h"
#include "memory/kv_pool.h"
#include "memory/memory_limits.h"
#include "tests/models/reference_forward.h"
#include "tests/models/tiny_model.h"
#include "tests/test_support.h"

using namespace tandem;

namespace {

nlohmann::json stories_reference() { return nlohmann::json::parse(test::read_file(test::data_path("reference/stories260K-greedy.json"))); }

std::vector<int32_t> greedy(models::forward_context& ctx, std::span<const int32_t> prompt, int n) {
  ctx.eval(prompt);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    const auto l = ctx.logits();
    const int32_t id = static_cast<int32_t>(std::max_element(l.begin(), l.end()) - l.begin());
    out.push_back(id);
    if (i + 1 < n) ctx.eval(std::span<const int32_t>(&out.back(), 1));
  }
  return out;
}

}  // namespace

TEST_SUITE("forward") {
  TEST_CASE("stories260K matches llama.cpp's logits and greedy tokens") {
    // The reference comes from llama.cpp's default CPU path: F16 KV cache and its
    // flash-attention kernel, whose arithmetic our F16 attention reproduces (see
    // kernels/cpu/attention.cpp), hence the 1e-3 bound. An F32 cache skips those F16 roundings
    // and lands ~2e-3 away from llama.cpp (and within float noise of the float64 reference,
    // checked below); its greedy tokens are the same.
    const auto ref = stories_reference();
    const auto prompt = ref["prompt_ids_with_bos"].get<std::vector<int32_t>>();
    models::model m(test::data_path("stories260K.gguf").string());
    kernels::cpu::thread_pool pool(2);
    for (auto [kv, tol] : {std::pair{kernels::cpu::kv_type::f16, 1e-3f}, std::pair{kernels::cpu::kv_type::f32, 5e-3f}}) {
      CAPTURE(static_cast<int>(kv));
      models::forward_context ctx(m, {.n_ctx = 128, .kv = kv}, &pool);
      ctx.eval(prompt);
      const auto logits = ctx.logits();
      const auto want = ref["first_position_logits_ids_0_to_9"].get<std::vector<float>>();
      for (size_t i = 0; i < want.size(); ++i) CHECK(std::abs(logits[i] - want[i]) < tol);
      for (const auto& top : ref["first_position_top5"]) {
        const int id = top[0];
        CHECK(std::abs(logits[id] - top[1].get<float>()) < tol);
      }
      ctx.reset();
      CHECK(greedy(ctx, prompt, 48) == ref["generated_ids"].get<std::vector<int32_t>>());
    }
  }

  TEST_CASE("the server's arithmetic gives stories260K's greedy tokens too (F32 and Q8_0, both caches)") {
    // What the engine computes every row with (set_prompt_end: tiled f32 attention, SwiGLU's
    // vector e^x) departs from llama.cpp's bits by float noise; on the test model that noise
    // must not move a greedy token, whatever the weight type or cache.
    const auto ref = stories_reference();
    const auto prompt = ref["prompt_ids_with_bos"].get<std::vector<int32_t>>();
    const auto want = ref["generated_ids"].get<std::vector<int32_t>>();
    kernels::cpu::thread_pool pool(2);
    for (const char* file : {"stories260K.gguf", "stories260K-q8_0.gguf"}) {
      models::model m(test::data_path(file).string());
      for (const auto kv : {kernels::cpu::kv_type::f16, kernels::cpu::kv_type::f32}) {
        CAPTURE(file);
        CAPTURE(static_cast<int>(kv));
        models::forward_context ctx(m, {.n_ctx = 128, .kv = kv}, &pool);
        ctx.set_prompt_end(0, std::numeric_limits<int64_t>::max());
        CHECK(greedy(ctx, prompt, static_cast<int>(want.size())) == want);
      }
    }
  }

  TEST_CASE("batched prompt equals token-by-token evaluation, chunked or not") {
    models::model m(test::data_path("stories260K.gguf").string());
    const std::vector<int32_t> toks = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298};
    models::forward_context whole(m, {.n_ctx = 64, .kv = kernels::cpu::kv_type::f32}, nullptr);
    whole.eval(toks, /*all_logits=*/true);
    const auto all = whole.all_logits_rows();
    REQUIRE(all.size() == toks.size() * 512);
    models::forward_context chunked(m, {.n_ctx = 64, .kv = kernels::cpu::kv_type::f32, .max_batch = 4}, nullptr);
    chunked.eval(toks, true);
    models::forward_context single(m, {.n_ctx = 64, .kv = kernels::cpu::kv_type::f32}, nullptr);
    for (size_t t = 0; t < toks.size(); ++t) {
      single.eval(std::span<const int32_t>(&toks[t], 1));
      for (int i = 0; i < 512; ++i) {
        REQUIRE(std::abs(single.logits()[i] - all[t * 512 + i]) < 1e-4f);
        REQUIRE(std::abs(chunked.all_logits_rows()[t * 512 + i] - all[t * 512 + i]) < 1e-4f);
      }
    }
  }

  TEST_CASE("batched decode of several sequences equals decoding each alone") {
    // Three prompts of different lengths, then steps where every sequence (or a subset, in
    // shuffled order) decodes one token in one pass. Each row must equal what a context
    // holding only that sequence produces; the matmuls then see several rows at once, so
    // only float accumulation order may differ.
    for (const char* file : {"stories260K.gguf", "stories260K-q8_0.gguf"}) {
      CAPTURE(file);
      models::model m(test::data_path(file).string());
      const std::vector<std::vector<int32_t>> prompts = {{1, 403, 407}, {1, 261, 378, 432, 383}, {1, 286}};
      const std::vector<std::vector<int32_t>> steps = {{261, 376, 298}, {300, 301, 302}, {310, 311, 312}};
      const std::vector<std::vector<int64_t>> order = {{0, 1, 2}, {2, 0, 1}, {1, 2, 0}};
      models::forward_context batch(m, {.n_ctx = 32, .kv = kernels::cpu::kv_type::f16, .n_seq = 3}, nullptr);
      CHECK(batch.n_seq() == 3);
      std::vector<std::unique_ptr<models::forward_context>> alone;
      for (size_t s = 0; s < prompts.size(); ++s) {
        batch.eval(prompts[s], false, static_cast<int64_t>(s));
        alone.push_back(std::make_unique<models::forward_context>(m, models::context_params{.n_ctx = 32}, nullptr));
        alone.back()->eval(prompts[s]);
        for (int i = 0; i < 512; ++i) REQUIRE(batch.logits()[i] == doctest::Approx(alone.back()->logits()[i]).epsilon(1e-4));
      }
      for (size_t step = 0; step < steps.size(); ++step) {
        std::vector<int32_t> toks;
        for (const int64_t s : order[step]) toks.push_back(steps[step][static_cast<size_t>(s)]);
        batch.decode(toks, order[step]);
        REQUIRE(batch.all_logits_rows().size() == 3 * 512);
        for (size_t i = 0; i < order[step].size(); ++i) {
          const auto s = static_cast<size_t>(order[step][i]);
          alone[s]->eval(std::span<const int32_t>(&toks[i], 1));
          CHECK(batch.pos(order[step][i]) == alone[s]->pos());
          for (int v = 0; v < 512; ++v) REQUIRE(std::abs(batch.all_logits_rows()[i * 512 + v] - alone[s]->logits()[v]) < 2e-4f);
        }
      }
      // A subset decodes; the others keep their positions.
      const std::vector<int32_t> one = {5};
      const std::vector<int64_t> which = {1};
      const int64_t before0 = batch.pos(0);
      batch.decode(one, which);
      CHECK(batch.pos(0) == before0);
      CHECK(batch.pos(1) == static_cast<int64_t>(prompts[1].size() + steps.size() + 1));
      CHECK(batch.logits().size() == 512);
    }
  }

  TEST_CASE("a paged KV cache gives the contiguous cache's logits bit for bit") {
    // Three sequences whose blocks interleave in the pool (reserved 16 positions at a time,
    // in turn), prompts that cross block boundaries, then batched decode steps.
    for (const auto kv : {kernels::cpu::kv_type::f16, kernels::cpu::kv_type::f32}) {
      models::model m(test::data_path("stories260K-q8_0.gguf").string());
      const auto& c = m.config();
      const int64_t bt = 16;
      const auto block = static_cast<size_t>(models::kv_bytes_per_token(c, kv) * bt);
      std::vector<std::byte> mem(40 * block);
      memory::kv_pool pool(mem.data(), 40, bt, block);
      kernels::cpu::thread_pool threads(2);
      models::forward_context paged(m, {.n_ctx = 96, .kv = kv, .max_batch = 7, .n_seq = 3, .kv_pool = &pool}, &threads);
      models::forward_context flat(m, {.n_ctx = 96, .kv = kv, .max_batch = 7, .n_seq = 3}, &threads);
      CHECK(models::forward_context::memory_bytes(c, {.n_ctx = 96, .kv = kv, .n_seq = 3, .kv_pool = &pool}) <
            models::forward_context::memory_bytes(c, {.n_ctx = 96, .kv = kv, .n_seq = 3}));
      const std::vector<std::vector<int32_t>> prompts = {
          {1, 403, 407, 261, 378, 432, 383, 286, 300, 301, 302, 303, 304, 305, 306, 307, 308, 309, 310}, {1, 261}, {1, 286, 287, 288}};
      for (int64_t grow = 16; grow <= 64; grow += 16)
        for (int64_t s = 0; s < 3; ++s) REQUIRE(pool.reserve(s, grow) == memory::status::ok);
      CHECK(pool.table(0)[1] != pool.table(0)[0] + 1);  // interleaved, not contiguous
      for (int64_t s = 0; s < 3; ++s) {
        paged.eval(prompts[static_cast<size_t>(s)], false, s);
        flat.eval(prompts[static_cast<size_t>(s)], false, s);
        CHECK(std::vector<float>(paged.logits().begin(), paged.logits().end()) == std::vector<float>(flat.logits().begin(), flat.logits().end()));
      }
      const std::vector<int64_t> seqs = {2, 0, 1};
      for (int step = 0; step < 20; ++step) {
        const std::vector<int32_t> toks = {int32_t(10 + step), int32_t(40 + step), int32_t(90 + step)};
        paged.decode(toks, seqs);
        flat.decode(toks, seqs);
        REQUIRE(std::vector<float>(paged.all_logits_rows().begin(), paged.all_logits_rows().end()) ==
                std::vector<float>(flat.all_logits_rows().begin(), flat.all_logits_rows().end()));
      }
      // Past the reserved blocks: refused before any work, naming what to do.
      pool.truncate(1, 16);
      paged.truncate(10, 1);
      const std::vector<int32_t> many(10, 5);
      CHECK_THROWS_WITH_AS(paged.eval(many, false, 1), doctest::Contains("reserve them in the KV pool"), std::invalid_argument);
      CHECK(paged.pos(1) == 10);
      pool.check();
    }
  }

  TEST_CASE("swapping a sequence's KV out and back in mid-generation gives the same tokens") {
    models::model m(test::data_path("stories260K.gguf").string());
    const auto& c = m.config();
    const auto kv = kernels::cpu::kv_type::f16;
    const auto block = static_cast<size_t>(models::kv_bytes_per_token(c, kv) * 16);
    auto backend = memory::make_cpu_backend();
    memory::arbiter arb(*backend, {64 << 20, 64 << 20});
    auto pool = memory::kv_pool::make(arb, "stories", 24, 16, block);
    REQUIRE(pool);
    models::forward_context ctx(m, {.n_ctx = 128, .kv = kv, .n_seq = 2, .kv_pool = pool.get()}, nullptr);
    models::forward_context ref(m, {.n_ctx = 128, .kv = kv}, nullptr);
    auto greedy = [](std::span<const float> lg) { return static_cast<int32_t>(std::max_element(lg.begin(), lg.end()) - lg.begin()); };
    const std::vector<int32_t> prompt = {1, 403, 407, 261, 378};
    REQUIRE(pool->reserve(0, 128) == memory::status::ok);
    ctx.eval(prompt, false, 0);
    ref.eval(prompt);
    std::vector<int32_t> got, want;
    for (int i = 0; i < 40; ++i) {
      int32_t t = greedy(ref.logits());
      want.push_back(t);
      ref.eval({&t, 1});
      t = greedy(ctx.logits());
      got.push_back(t);
      if (i == 17) {
        // Preempted: the KV goes to the host; another sequence takes the freed blocks and
        // writes over them; then the first comes back into other blocks.
        const auto before = pool->table(0);
        REQUIRE(pool->swap_out(0) == memory::status::ok);
        std::memset(pool->data(), 0x7B, static_cast<size_t>(pool->total_blocks()) * pool->block_bytes());  // nothing is live now
        REQUIRE(pool->reserve(1, 16 * 20) == memory::status::ok);
        const std::vector<int32_t> other(40, 300);
        ctx.eval(other, false, 1);
        pool->drop(1);
        ctx.reset(1);
        REQUIRE(pool->reserve(1, 16 * 4) == memory::status::ok);  // shifts which blocks are free
        REQUIRE(pool->swap_in(0) == memory::status::ok);
        CHECK(pool->table(0) != before);
      }
      ctx.eval({&t, 1}, false, 0);
    }
    CHECK(got == want);
    pool->check();
    arb.check_integrity();
  }

  TEST_CASE("a mixed step (prompt chunks and decode tokens of several sequences) equals running each alone") {
    for (const char* file : {"stories260K.gguf", "stories260K-q8_0.gguf"}) {
      CAPTURE(file);
      models::model m(test::data_path(file).string());
      models::forward_context mixed(m, {.n_ctx = 64, .max_batch = 16, .n_seq = 3}, nullptr);
      std::vector<std::unique_ptr<models::forward_context>> alone;
      for (int s = 0; s < 3; ++s) alone.push_back(std::make_unique<models::forward_context>(m, models::context_params{.n_ctx = 64}, nullptr));
      // Sequence 1 has a prompt already; then one pass carries 0's first chunk, 1's next token
      // and 2's whole prompt.
      const std::vector<int32_t> p1 = {1, 261, 378};
      mixed.eval(p1, false, 1);
      alone[1]->eval(p1);
      const std::vector<int32_t> toks = {1, 403, 407, 300, 5, 1, 286, 287};
      const std::vector<int64_t> seqs = {0, 0, 0, 0, 1, 2, 2, 2};
      mixed.step(toks, seqs);
      alone[0]->eval(std::span<const int32_t>(toks.data(), 4));
      alone[1]->eval(std::span<const int32_t>(toks.data() + 4, 1));
      alone[2]->eval(std::span<const int32_t>(toks.data() + 5, 3));
      REQUIRE(mixed.all_logits_rows().size() == 3 * 512);
      for (int s = 0; s < 3; ++s) {
        CAPTURE(s);
        const auto want = alone[static_cast<size_t>(s)]->logits();
        const float* got = mixed.all_logits_rows().data() + s * 512;
        for (int v = 0; v < 512; ++v) REQUIRE(std::abs(got[v] - want[v]) < 2e-4f);
        CHECK(std::max_element(got, got + 512) - got == std::max_element(want.begin(), want.end()) - want.begin());
      }
      CHECK(mixed.pos(0) == 4);
      CHECK(mixed.pos(1) == 4);
      CHECK(mixed.pos(2) == 3);
      // Rows of a sequence that are not consecutive, and overflows, are refused before any work.
      const std::vector<int32_t> bad_t = {5, 6, 7};
      const std::vector<int64_t> bad_s = {0, 1, 0};
      CHECK_THROWS_AS(mixed.step(bad_t, bad_s), std::invalid_argument);
      const std::vector<int32_t> many(17, 5);
      const std::vector<int64_t> many_s(17, 0);
      CHECK_THROWS_AS(mixed.step(many, many_s), std::invalid_argument);
      CHECK(mixed.pos(0) == 4);
    }
  }

  TEST_CASE("logits for several rows of a run (verifying proposals) equal one row at a time; truncate forgets the rejected") {
    // The server's arithmetic (set_prompt_end): a row's logits do not depend on the rows beside
    // it, so k + 1 rows of one sequence in one pass give what k + 1 single-row passes give.
    constexpr int64_t all = std::numeric_limits<int64_t>::max();
    models::model m(test::data_path("stories260K-q8_0.gguf").string());
    models::forward_context verify(m, {.n_ctx = 64, .max_batch = 16, .n_seq = 2}, nullptr), one(m, {.n_ctx = 64}, nullptr);
    for (int64_t s = 0; s < 2; ++s) verify.set_prompt_end(s, all);
    one.set_prompt_end(0, all);
    const std::vector<int32_t> prompt = {1, 403, 407, 261, 378};
    verify.eval(prompt, false, 0);
    verify.eval(prompt, false, 1);
    one.eval(prompt);
    // Sequence 0: its last token and three proposals, every row's logits; sequence 1: one row.
    const std::vector<int32_t> toks = {300, 301, 302, 303, 77};
    const std::vector<int64_t> seqs = {0, 0, 0, 0, 1};
    const std::vector<int64_t> rows = {4, 1};
    verify.step(toks, seqs, rows);
    REQUIRE(verify.all_logits_rows().size() == 5 * 512);
    for (int i = 0; i < 4; ++i) {
      CAPTURE(i);
      one.eval(std::span<const int32_t>(toks.data() + i, 1));
      CHECK(std::equal(one.logits().begin(), one.logits().end(), verify.all_logits_rows().begin() + i * 512));
    }
    // Rows 2 and 3 rejected: back to position 7, then the corrected token.
    verify.truncate(7, 0);
    one.truncate(7);
    const std::vector<int32_t> fix = {41};
    const std::vector<int64_t> seq0 = {0};
    verify.step(fix, seq0);
    one.eval(fix);
    CHECK(std::equal(one.logits().begin(), one.logits().end(), verify.all_logits_rows().begin()));
    CHECK(verify.pos(0) == 8);
    // Bad logit rows: refused before any work.
    const std::vector<int64_t> too_many = {5, 1}, zero = {0, 1}, short_list = {4};
    CHECK_THROWS_WITH_AS(verify.step(toks, seqs, too_many), doctest::Contains("for a run of 4 rows"), std::invalid_argument);
    CHECK_THROWS_AS(verify.step(toks, seqs, zero), std::invalid_argument);
    CHECK_THROWS_WITH_AS(verify.step(toks, seqs, short_list), doctest::Contains("logit rows for 1 sequences, the pass has 2"), std::invalid_argument);
    CHECK(verify.pos(0) == 8);
    CHECK_THROWS_AS(verify.truncate(9, 0), std::invalid_argument);
  }

  TEST_CASE("a pass in parts (begin, one advance per layer) equals step; begin abandons an unfinished pass") {
    models::model m(test::data_path("stories260K.gguf").string());
    const auto n_layer = m.config().n_layer;
    REQUIRE(n_layer > 1);
    models::forward_context whole(m, {.n_ctx = 64, .n_seq = 2}, nullptr);
    models::forward_context parts(m, {.n_ctx = 64, .n_seq = 2}, nullptr);
    const std::vector<int32_t> toks = {1, 403, 407, 1, 286};
    const std::vector<int64_t> seqs = {0, 0, 0, 1, 1};
    whole.step(toks, seqs);
    parts.begin(toks, seqs);
    int64_t advances = 1;
    while (!parts.advance()) {
      ++advances;
      CHECK(parts.pos(0) == 0);  // positions move only once the pass is over
    }
    CHECK(advances == n_layer);
    CHECK(parts.pos(0) == 3);
    CHECK(parts.pos(1) == 2);
    const auto a = whole.all_logits_rows(), b = parts.all_logits_rows();
    REQUIRE(a.size() == b.size());
    CHECK(std::equal(a.begin(), a.end(), b.begin()));
    CHECK(parts.advance());  // nothing begun: done at once

    // A pass left midway moves nothing; the next begin starts afresh.
    const std::vector<int32_t> next = {300, 5};
    const std::vector<int64_t> next_s = {0, 1};
    parts.begin(next, next_s);
    CHECK_FALSE(parts.advance());
    parts.step(next, next_s);
    whole.step(next, next_s);
    CHECK(parts.pos(0) == 4);
    const auto c = whole.all_logits_rows(), d = parts.all_logits_rows();
    CHECK(std::equal(c.begin(), c.end(), d.begin()));
  }

  TEST_CASE("set_prompt_end picks each row's arithmetic by its own sequence, whatever shares the pass") {
    // Three passes of the same rows: the server's arithmetic (tiled attention, SwiGLU's vector
    // e^x) for sequence 0 only, for every sequence, for none. A sequence's logits depend on
    // its own setting alone; sequence 2 switches in the middle of its prompt. F32 weights: no
    // activation quantization rounds SwiGLU's few-ulp differences away. An F32 cache, so that
    // the differences of sequence 2's first rows reach its last row through K and V: an F16
    // cache rounded them all away in an -O2 AVX2 build (the sanitizer pass on a Zen 3), and
    // the last row then equalled the all-exact pass by chance.
    models::model m(test::data_path("stories260K.gguf").string());
    kernels::cpu::thread_pool pool(2);
    const std::vector<int32_t> toks = {1, 403, 407, 1, 261, 1, 286, 287};
    const std::vector<int64_t> seqs = {0, 0, 0, 1, 1, 2, 2, 2};
    auto run = [&](int64_t end0, int64_t end1, int64_t end2) {
      models::forward_context ctx(m, {.n_ctx = 32, .kv = kernels::cpu::kv_type::f32, .max_batch = 16, .n_seq = 3}, &pool);
      ctx.set_prompt_end(0, end0);
      ctx.set_prompt_end(1, end1);
      ctx.set_prompt_end(2, end2);
      ctx.step(toks, seqs);
      const auto rows = ctx.all_logits_rows();
      return std::vector<float>(rows.begin(), rows.end());
    };
    constexpr int64_t all = std::numeric_limits<int64_t>::max();
    const auto mixed = run(all, 0, 2), fast = run(all, all, all), exact = run(0, 0, 0);
    REQUIRE(mixed.size() == 3 * 512);
    auto row = [](const std::vector<float>& l, int s) { return std::vector<float>(l.begin() + s * 512, l.begin() + (s + 1) * 512); };
    CHECK(row(fast, 1) != row(exact, 1));  // the two arithmetics differ here, so the checks below can see a mix-up
    CHECK(row(mixed, 0) == row(fast, 0));
    CHECK(row(mixed, 1) == row(exact, 1));
    CHECK(row(mixed, 2) != row(fast, 2));
    CHECK(row(mixed, 2) != row(exact, 2));
  }

  TEST_CASE("batched decode refuses bad input before any work") {
    models::model m(test::data_path("stories260K.gguf").string());
    models::forward_context ctx(m, {.n_ctx = 4, .n_seq = 2}, nullptr);
    const std::vector<int32_t> two = {1, 2};
    CHECK_THROWS_WITH_AS(ctx.decode(two, std::vector<int64_t>{0}), doctest::Contains("2 tokens for 1"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(ctx.decode(two, std::vector<int64_t>{0, 0}), doctest::Contains("listed twice"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(ctx.decode(two, std::vector<int64_t>{0, 2}), doctest::Contains("sequence 2"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(ctx.decode(std::vector<int32_t>{1, 512}, std::vector<int64_t>{0, 1}), doctest::Contains("token id 512"),
                         std::invalid_argument);
    CHECK_THROWS_AS(ctx.eval(two, false, -1), std::invalid_argument);
    CHECK(ctx.pos(0) == 0);
    CHECK(ctx.pos(1) == 0);
    ctx.eval(std::vector<int32_t>{1, 2, 3, 4}, false, 1);
    CHECK_THROWS_WITH_AS(ctx.decode(two, std::vector<int64_t>{0, 1}), doctest::Contains("sequence 1 is full"), std::invalid_argument);
    CHECK(ctx.pos(0) == 0);
    ctx.reset(1);
    CHECK(ctx.pos(1) == 0);
    CHECK_THROWS_AS(models::forward_context(m, {.n_ctx = 4, .n_seq = 0}, nullptr), std::invalid_argument);
    CHECK_THROWS_AS(models::forward_context(m, {.n_ctx = 4, .n_seq = models::k_max_sequences + 1}, nullptr), std::invalid_argument);
    // n_seq slots of cache, and at least n_seq scratch rows and logits rows.
    using kernels::cpu::kv_type;
    const auto& c = m.config();
    const uint64_t row = (2 * (64 + 64 + 32 + 172) + 8) * 4;
    CHECK(models::forward_context::memory_bytes(c, {.n_ctx = 16, .kv = kv_type::f16, .max_batch = 1, .n_seq = 3}) ==
          3 * (5 * 2 * 16 * 32 * 2) + 3 * row + 3 * 512 * 4);
  }

  TEST_CASE("the forward pass matches a double-precision reference on stories260K (F32 and Q8_0)") {
    const std::vector<int32_t> toks = {1, 403, 407, 261, 378, 432, 383};
    // Error is max |ours - reference| / max |reference| over the logits. F32 weights: only
    // float rounding separates the two (F32 KV cache). Q8_0: the activations are quantized to
    // Q8_0 blocks as llama.cpp does, which moves logits by about 1% of their scale.
    for (auto [file, tol] : {std::pair{"stories260K.gguf", 1e-5}, std::pair{"stories260K-q8_0.gguf", 0.02}}) {
      CAPTURE(file);
      models::model m(test::data_path(file).string());
      models::forward_context ctx(m, {.n_ctx = 64, .kv = kernels::cpu::kv_type::f32}, nullptr);
      ctx.eval(toks);
      const auto want = test::reference_logits(m, toks);
      CHECK(test::relative_max_error(ctx.logits(), want) < tol);
    }
  }

  TEST_CASE("bad input is refused before any work") {
    models::model m(test::data_path("stories260K.gguf").string());
    models::forward_context ctx(m, {.n_ctx = 8}, nullptr);
    const std::vector<int32_t> bad = {1, 512};
    CHECK_THROWS_AS(ctx.eval(bad), std::invalid_argument);
    CHECK(ctx.pos() == 0);
    const std::vector<int32_t> long_prompt(9, 1);
    CHECK_THROWS_AS(ctx.eval(long_prompt), std::invalid_argument);
    CHECK(ctx.pos() == 0);
    const std::vector<int32_t> ok(8, 1);
    ctx.eval(ok);
    CHECK(ctx.pos() == 8);
    CHECK_THROWS_AS(ctx.eval(std::span<const int32_t>(ok.data(), 1)), std::invalid_argument);
    ctx.truncate(7);
    CHECK(ctx.pos() == 7);
    CHECK_THROWS_AS(ctx.truncate(8), std::invalid_argument);
    // stories260K's heads are 8 wide: no whole 32-value block for a quantized cache, and 8 is
    // a power of two, so only the quantized types are refused.
    using kernels::cpu::kv_type;
    for (const kv_type kv : {kv_type::q8_0, kv_type::q4_0})
      CHECK_THROWS_WITH_AS(models::forward_context(m, {.n_ctx = 8, .kv = kv}, nullptr),
                           doctest::Contains("multiple of 32 elements (the model's heads are 8 wide)"), std::invalid_argument);
    CHECK(models::kv_type_problem(m.config(), kv_type::f16, true).empty());
    CHECK(models::kv_type_problem(m.config(), kv_type::q4_0, true).find("multiple of 32") != std::string::npos);
    models::model_config wide = m.config();
    wide.head_dim = 96;  // whole blocks, but no power of two to rotate
    CHECK(models::kv_type_problem(wide, kv_type::q8_0, false).empty());
    CHECK(models::kv_type_problem(wide, kv_type::q4_0, true) ==
          "a rotated KV cache needs heads of a power-of-two width (the model's heads are 96 wide)");
  }

  TEST_CASE("the KV cache is sized from the context and bounded") {
    models::model m(test::data_path("stories260K.gguf").string());
    // 5 layers x (K + V) x 128 positions x 4 KV heads x 8 dims x 2 bytes.
    CHECK(models::kv_cache_bytes(m.config(), 128, kernels::cpu::kv_type::f16) == 5 * 2 * 128 * 32 * 2);
    CHECK(models::kv_cache_bytes(m.config(), 128, kernels::cpu::kv_type::f32) == 5 * 2 * 128 * 32 * 4);
    CHECK_THROWS_AS(models::forward_context(m, {.n_ctx = models::k_max_context + 1}, nullptr), std::invalid_argument);
    CHECK_THROWS_AS(models::forward_context::memory_bytes(m.config(), {.n_ctx = models::k_max_context + 1}), std::invalid_argument);
    CHECK_THROWS_AS(models::forward_context::memory_bytes(m.config(), {.n_ctx = -1}), std::invalid_argument);
    models::forward_context ctx(m, {}, nullptr);  // default: the training context (128 < 4096)
    CHECK(ctx.n_ctx() == 128);
  }

  TEST_CASE("memory_bytes: KV cache + scratch of min(max_batch, n_ctx) rows + one row of logits") {
    models::model m(test::data_path("stories260K.gguf").string());
    const auto& c = m.config();
    // Per scratch row: x, xb (64) + q, attn (64) + k, v (32) + ff_gate, ff_up (172) floats, and
    // RoPE's cos/sin of its position (head_dim 8).
    const uint64_t row = (2 * (64 + 64 + 32 + 172) + 8) * 4;
    const uint64_t logits = 512 * 4;
    using kernels::cpu::kv_type;
    CHECK(models::forward_context::memory_bytes(c, {.n_ctx = 128, .kv = kv_type::f16}) == 5 * 2 * 128 * 32 * 2 + 128 * row + logits);
    CHECK(models::forward_context::memory_bytes(c, {.n_ctx = 128, .kv = kv_type::f32, .max_batch = 16}) == 5 * 2 * 128 * 32 * 4 + 16 * row + logits);
    CHECK(models::forward_context::memory_bytes(c, {.n_ctx = 100, .kv = kv_type::f16, .max_batch = 0}) == 5 * 2 * 100 * 32 * 2 + row + logits);
    // n_ctx 0 is sized as the context the constructor picks.
    CHECK(models::forward_context::memory_bytes(c, {}) == models::forward_context::memory_bytes(c, {.n_ctx = 128}));
  }

  TEST_CASE("scratch rows are max_batch clamped to [1, n_ctx]") {
    models::model m(test::data_path("stories260K.gguf").string());
    CHECK(models::forward_context(m, {.n_ctx = 8}, nullptr).max_batch() == 8);
    CHECK(models::forward_context(m, {.n_ctx = 64, .max_batch = 4}, nullptr).max_batch() == 4);
    CHECK(models::forward_context(m, {.n_ctx = 64, .max_batch = -3}, nullptr).max_batch() == 1);
    // A full context still runs in one pass with the clamped scratch.
    models::forward_context ctx(m, {.n_ctx = 8, .kv = kernels::cpu::kv_type::f32}, nullptr);
    const std::vector<int32_t> toks = {1, 403, 407, 261, 378, 432, 383, 286};
    ctx.eval(toks, /*all_logits=*/true);
    CHECK(ctx.pos() == 8);
    CHECK(ctx.all_logits_rows().size() == 8 * 512);
    CHECK(std::all_of(ctx.all_logits_rows().begin(), ctx.all_logits_rows().end(), [](float v) { return std::isfinite(v); }));
  }

  TEST_CASE("n_ctx 0 means min(training context, 4096), as llama.cpp") {
    test::scratch_dir dir;
    test::tiny_model t;
    t.n_ctx = 8192;
    t.write((dir / "m.gguf").string());
    const models::model m((dir / "m.gguf").string());
    CHECK(models::k_default_context == 4096);
    CHECK(models::forward_context(m, {}, nullptr).n_ctx() == 4096);
    CHECK(models::forward_context(m, {.n_ctx = 5000}, nullptr).n_ctx() == 5000);  // asked for: as asked
    CHECK(models::forward_context::memory_bytes(m.config(), {}) == models::forward_context::memory_bytes(m.config(), {.n_ctx = 4096}));
  }

  TEST_CASE("a context that cannot fit in memory is refused before allocating, naming the sizes") {
    // One layer, 8 KV heads of 1024: 64 KiB of f32 K+V per position, so 2^24 positions need
    // 1 TiB, more than any test machine has, while the file is ~2 MiB.
    test::scratch_dir dir;
    test::tiny_model t;
    t.n_layer = 1;
    t.n_head = 8;
    t.n_head_kv = 8;
    t.key_length = 1024;
    t.n_ctx = models::k_max_context;
    t.write((dir / "wide.gguf").string());
    const models::model m((dir / "wide.gguf").string());
    const models::context_params p{.n_ctx = models::k_max_context, .kv = kernels::cpu::kv_type::f32};
    const uint64_t kv = uint64_t{1} << 40;
    const uint64_t scratch = 512ull * (2 * (16 + 8192 + 8192 + 24) + 1024) * 4;
    CHECK(models::forward_context::memory_bytes(m.config(), p) == kv + scratch + 32 * 4);
    REQUIRE(memory::usable_memory_bytes(memory::read_memory_limits()) < kv);
    try {
      models::forward_context ctx(m, p, nullptr);
      FAIL("a 1 TiB context was accepted");
    } catch (const std::runtime_error& e) {
      const std::string msg = e.what();
      CHECK(msg.find("16777216 tokens") != std::string::npos);
      CHECK(msg.find("KV cache 1048576.0 MiB") != std::string::npos);
      CHECK(msg.find("use a smaller context size") != std::string::npos);
    }
  }

  TEST_CASE("a multi-chunk prompt gives the same last logits as token-by-token evaluation") {
    models::model m(test::data_path("stories260K.gguf").string());
    const std::vector<int32_t> toks = {1, 403, 407, 261, 378, 432, 383, 286, 261, 376, 298};
    using kernels::cpu::kv_type;
    models::forward_context single(m, {.n_ctx = 64, .kv = kv_type::f32}, nullptr);
    for (const int32_t t : toks) single.eval(std::span<const int32_t>(&t, 1));
    for (int64_t batch : {1, 3, 4, 5, 11}) {
      CAPTURE(batch);
      models::forward_context chunked(m, {.n_ctx = 64, .kv = kv_type::f32, .max_batch = batch}, nullptr);
      chunked.eval(toks);
      REQUIRE(chunked.logits().size() == 512);
      for (int i = 0; i < 512; ++i) REQUIRE(std::abs(chunked.logits()[i] - single.logits()[i]) < 1e-4f);
      // An all-logits eval followed by a plain one: logits() is the plain one's last token.
      chunked.reset();
      chunked.eval(std::span<const int32_t>(toks.data(), 6), /*all_logits=*/true);
      chunked.eval(std::span<const int32_t>(toks.data() + 6, 5));
      for (int i = 0; i < 512; ++i) REQUIRE(std::abs(chunked.logits()[i] - single.logits()[i]) < 1e-4f);
    }
  }

  TEST_CASE("heads wider than n_embd / n_head fit the scratch (q_dim > n_embd)") {
    // qwen3-style: n_embd 16, 4 heads of 8, so q_dim 32; wo maps it back to 16 per row.
    test::scratch_dir dir;
    test::tiny_model t;
    t.arch = "qwen3";
    t.qk_norm = true;
    t.key_length = 8;
    t.write((dir / "m.gguf").string());
    const models::model m((dir / "m.gguf").string());
    REQUIRE(m.config().q_dim() > m.config().n_embd);
    const std::vector<int32_t> toks = {1, 5, 9, 30, 2, 7};
    models::forward_context whole(m, {.n_ctx = 16, .kv = kernels::cpu::kv_type::f32, .max_batch = 4}, nullptr);
    whole.eval(toks, /*all_logits=*/true);
    models::forward_context single(m, {.n_ctx = 16, .kv = kernels::cpu::kv_type::f32}, nullptr);
    for (size_t r = 0; r < toks.size(); ++r) {
      single.eval(std::span<const int32_t>(&toks[r], 1));
      for (int i = 0; i < 32; ++i) {
        REQUIRE(std::isfinite(single.logits()[i]));
        REQUIRE(std::abs(single.logits()[i] - whole.all_logits_rows()[r * 32 + i]) < 1e-4f);
      }
    }
  }
}
