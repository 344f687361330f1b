#include "runtime/batch_plan.h"

#include <doctest/doctest.h>

#include <vector>

#include "runtime/admission_plan.h"
#include "runtime/itl_estimator.h"

using namespace tandem;
using runtime::batch_sequence;

namespace {

// A sequence decoding at position `pos`, holding the blocks that covers (16 positions each).
batch_sequence decoding(int64_t prompt, int64_t pos, int32_t held) { return {prompt, prompt, pos, held, held}; }
// A prompt of `prompt` tokens with `prefilled` of them in the KV.
batch_sequence prefilling(int64_t prompt, int64_t prefilled, int32_t held) { return {prompt, prefilled, prefilled, held, held}; }

runtime::batch_state state(std::vector<batch_sequence> running, int32_t free_blocks) {
  runtime::batch_state s;
  s.running = std::move(running);
  s.max_rows = 64;
  s.prefill_chunk = 16;
  s.block_tokens = 16;
  s.free_blocks = free_blocks;
  return s;
}

}  // namespace

TEST_SUITE("batch_plan") {
  TEST_CASE("decode rows go first, one each, then prompt chunks in admission order") {
    auto s = state({prefilling(100, 0, 0), decoding(8, 20, 2), prefilling(40, 16, 1), decoding(8, 9, 1)}, 100);
    const auto p = runtime::plan_batch(s);
    REQUIRE(p.entries.size() == 4);
    CHECK(p.entries[0].seq == 1);
    CHECK(p.entries[1].seq == 3);
    CHECK((!p.entries[0].prompt && p.entries[0].rows == 1 && p.entries[0].first == 20));
    CHECK(p.entries[2].seq == 0);
    CHECK(p.entries[3].seq == 2);
    CHECK((p.entries[2].prompt && p.entries[2].first == 0 && p.entries[2].rows == 16));  // one chunk
    CHECK((p.entries[3].first == 16 && p.entries[3].rows == 16));
    CHECK(p.reserve_tokens == std::vector<int64_t>{21, 10, 16, 32});
    CHECK(p.decode_rows == 2);
    CHECK(p.prompt_rows == 32);
    CHECK(p.mixed);
    CHECK(p.preempt.empty());
  }

  TEST_CASE("prompt rows beside decoding streams are held to the ITL limit; short prompts go in whole") {
    SUBCASE("a long prompt beside a stream takes the limit") {
      auto s = state({decoding(8, 20, 2), prefilling(3000, 64, 4)}, 100);
      s.prompt_row_limit = 5;
      const auto p = runtime::plan_batch(s);
      REQUIRE(p.entries.size() == 2);
      CHECK(p.entries[1].rows == 5);
      CHECK(!p.entries[1].whole);
    }
    SUBCASE("two long prompts share it") {
      auto s = state({decoding(8, 20, 2), prefilling(3000, 64, 4), prefilling(500, 0, 0)}, 100);
      s.prompt_row_limit = 20;
      const auto p = runtime::plan_batch(s);
      REQUIRE(p.entries.size() == 3);
      CHECK(p.entries[1].rows == 16);
      CHECK(p.entries[2].rows == 4);
    }
    SUBCASE("alone, a prompt takes whole chunks whatever the limit") {
      auto s = state({prefilling(3000, 64, 4)}, 100);
      s.prompt_row_limit = 1;
      const auto p = runtime::plan_batch(s);
      REQUIRE(p.entries.size() == 1);
      CHECK(p.entries[0].rows == 16);
      CHECK(!p.mixed);
    }
    SUBCASE("a prompt of one chunk at most goes in whole outside the limit") {
      auto s = state({decoding(8, 20, 2), prefilling(12, 0, 0), prefilling(3000, 0, 0)}, 100);
      s.prompt_row_limit = 3;
      const auto p = runtime::plan_batch(s);
      REQUIRE(p.entries.size() == 3);
      CHECK((p.entries[1].rows == 12 && p.entries[1].whole));
      CHECK(p.entries[2].rows == 3);  // the long one still gets the whole limit
    }
    SUBCASE("the probe pass is decode rows alone") {
      auto s = state({decoding(8, 20, 2), prefilling(12, 0, 0), prefilling(3000, 0, 0)}, 100);
      s.probe_due = true;
      const auto p = runtime::plan_batch(s);
      REQUIRE(p.entries.size() == 1);
      CHECK(p.probe);
      CHECK(p.decode_rows == 1);
    }
    SUBCASE("during a swap-in a prompt takes as many rows as the pass holds") {
      auto s = state({prefilling(3000, 0, 0)}, 100);
      s.swap_in = true;
      CHECK(runtime::plan_batch(s).entries.at(0).rows == 64);
    }
    SUBCASE("the pass's rows bound everything") {
      auto s = state({decoding(8, 20, 2), decoding(8, 20, 2), prefilling(16, 0, 0)}, 100);
      s.max_rows = 10;
      const auto p = runtime::plan_batch(s);
      REQUIRE(p.entries.size() == 3);
      CHECK(p.entries[2].rows == 8);  // too long to go in whole: a chunk of what is left
    }
  }

  TEST_CASE("when KV runs out, cached blocks go first, then the sequence admitted last not in the pass") {
    SUBCASE("cached blocks are enough") {
      auto s = state({decoding(8, 32, 2), decoding(8, 48, 3)}, 0);
      s.cached_blocks = 5;
      const auto p = runtime::plan_batch(s);
      CHECK(p.entries.size() == 2);
      CHECK(p.drop_cached == 2);  // one block each for positions 32 and 48
      CHECK(p.preempt.empty());
    }
    SUBCASE("then the last admitted goes, and its blocks serve the others") {
      auto s = state({decoding(8, 32, 2), decoding(8, 48, 3), decoding(8, 60, 4)}, 0);
      s.cached_blocks = 1;
      const auto p = runtime::plan_batch(s);
      CHECK(p.drop_cached == 1);
      CHECK(p.preempt == std::vector<size_t>{2});
      REQUIRE(p.entries.size() == 2);
      CHECK(p.entries[0].seq == 0);
      CHECK(p.entries[1].seq == 1);
    }
    SUBCASE("a sequence already in the pass is not a victim: the one asking gives way") {
      auto s = state({decoding(8, 20, 2), decoding(8, 48, 3)}, 0);
      const auto p = runtime::plan_batch(s);
      CHECK(p.preempt == std::vector<size_t>{1});
      REQUIRE(p.entries.size() == 1);
      CHECK(p.entries[0].seq == 0);
    }
    SUBCASE("shared blocks free nothing") {
      auto s = state({decoding(8, 32, 2), prefilling(100, 32, 2), prefilling(100, 32, 2)}, 0);
      s.running[2].blocks_owned = 0;  // its blocks are a cached prefix others hold too
      const auto p = runtime::plan_batch(s);
      CHECK(p.preempt == std::vector<size_t>{2, 1});  // the first victim gave nothing back
      REQUIRE(p.entries.size() == 1);
      CHECK(p.entries[0].seq == 0);
    }
  }
}

TEST_SUITE("itl_estimator") {
  TEST_CASE("prompt rows fill a pass up to max(target, ratio x a decode pass)") {
    runtime::itl_estimator e;
    CHECK(e.prompt_row_limit({2.0, 0.05}, 16) == 4);  // costs unknown: a probe chunk
    e.learn(4, 0, 0.010);                             // decode pass 10 ms
    e.learn(4, 10, 0.030);                            // 10 prompt rows added 20 ms
    CHECK(e.decode_pass_s == doctest::Approx(0.010));
    CHECK(e.prompt_row_s == doctest::Approx(0.002));
    CHECK(e.prompt_row_limit({2.0, 0.05}, 16) == 15);  // the target: (0.8 x 50 - 10) / 2
    CHECK(e.prompt_row_limit({1.5, 0}, 16) == 2);      // the ratio alone: (15 - 10) / 2
    CHECK(e.prompt_row_limit({0, 0}, 16) == std::numeric_limits<int64_t>::max());
    CHECK(e.prompt_row_limit({1.0, 0.005}, 16) == 1);  // a prompt always advances
    CHECK(e.prompt_row_limit({0, 0.1}, 16) == 35);     // the target alone: (80 - 10) / 2
    e = {};
    e.learn(4, 0, 0.040);  // decode passes that take the target already: the ratio rules
    e.learn(4, 10, 0.060);
    CHECK(e.prompt_row_limit({2.0, 0.05}, 16) == 20);  // (80 - 40) / 2
  }
  TEST_CASE("every eighth mixed pass is a probe") {
    runtime::itl_estimator e;
    int probes = 0;
    for (int i = 0; i < 32; ++i) {
      probes += e.probe_next() ? 1 : 0;
      ++e.passes_with_prompts;
    }
    CHECK(probes == 4);
  }
}

TEST_SUITE("admission_plan") {
  runtime::admission_state base() {
    runtime::admission_state s;
    s.block_tokens = 16;
    s.prefill_chunk = 16;
    return s;
  }

  TEST_CASE("a preempted sequence comes back first, before any waiting request") {
    auto s = base();
    s.preempted_blocks = {3, 2};
    s.waiting = {{.prompt_tokens = 10}};
    s.running = 1;
    s.free_slots = 1;
    s.free_blocks = 8;
    const auto p = runtime::plan_admission(s);
    CHECK(p.resume == 2);  // 3 + 1 headroom, then 2 + 2 headroom: 7 of 8
    CHECK(p.admit == std::vector<size_t>{0});
  }

  TEST_CASE("without headroom a preempted sequence stays out, and so does everyone waiting") {
    auto s = base();
    s.preempted_blocks = {3};
    s.waiting = {{.prompt_tokens = 10}};
    s.running = 2;
    s.free_slots = 1;
    s.free_blocks = 4;  // 3 + 2 headroom wanted
    auto p = runtime::plan_admission(s);
    CHECK(p.resume == 0);
    CHECK(p.admit.empty());
    SUBCASE("cached blocks are released for it") {
      s.cached_blocks = 3;
      p = runtime::plan_admission(s);
      CHECK(p.resume == 1);
      CHECK(p.drop_cached == 1);
      CHECK(p.admit == std::vector<size_t>{0});
    }
    SUBCASE("with nothing running it comes back on its own blocks") {
      s.running = 0;
      s.free_blocks = 3;
      CHECK(runtime::plan_admission(s).resume == 1);
    }
  }

  TEST_CASE("waiting requests start in order into free slots while their first chunks fit") {
    auto s = base();
    s.waiting = {{.prompt_tokens = 40}, {.prompt_tokens = 10}, {.prompt_tokens = 10}};
    s.free_slots = 3;
    s.free_blocks = 2;
    CHECK(runtime::plan_admission(s).admit == std::vector<size_t>{0, 1});  // one block each
    s.free_slots = 1;
    CHECK(runtime::plan_admission(s).admit == std::vector<size_t>{0});
  }

  TEST_CASE("when the pool is tight, a request whose prompt is cached goes first, unless the front waited long") {
    auto s = base();
    s.prefill_chunk = 32;
    s.waiting = {{.prompt_tokens = 40}, {.prompt_tokens = 40, .cached_blocks = 2}};
    s.free_slots = 2;
    s.free_blocks = 1;    // the front's first chunk needs 2
    s.cached_blocks = 2;  // the second's prefix, the only blocks that could be released
    auto p = runtime::plan_admission(s);
    CHECK(p.admit == std::vector<size_t>{1});  // 2 blocks adopted, 1 new for its last 8 tokens
    CHECK(p.drop_cached == 0);
    s.waiting[0].waited_long = true;
    p = runtime::plan_admission(s);
    CHECK(p.admit == std::vector<size_t>{0});  // in queue order, a cached block released for it
    CHECK(p.drop_cached == 1);
  }
}
