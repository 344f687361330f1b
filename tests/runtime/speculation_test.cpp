// runtime/speculation: the n-gram lookup behind prompt lookup and predicted outputs, the
// per-sequence draft window, and the model's cache of recent outputs.
#include "runtime/speculation.h"

#include <doctest/doctest.h>

#include <vector>

using namespace tandem;
using runtime::lookup_proposals;

TEST_SUITE("speculation") {
  TEST_CASE("lookup_proposals: the longest suffix that matches, and what follows it") {
    const std::vector<int32_t> corpus{1, 2, 3, 4, 5, 9, 3, 4, 6, 7};
    std::vector<int32_t> out;
    // "3 4" occurs twice; "2 3 4" once: the longer match wins, at position 1.
    CHECK(lookup_proposals(corpus, std::vector<int32_t>{2, 3, 4}, 1, 3, 0, 4, out) == 4);
    CHECK(out == std::vector<int32_t>{5, 9, 3, 4});
    // Only "3 4" matches: the last occurrence (no preferred position), then at most 2.
    out.clear();
    CHECK(lookup_proposals(corpus, std::vector<int32_t>{8, 3, 4}, 2, 3, corpus.size(), 2, out) == 8);
    CHECK(out == std::vector<int32_t>{6, 7});
    // The first match ending at or after a preferred position.
    out.clear();
    CHECK(lookup_proposals(corpus, std::vector<int32_t>{3, 4}, 2, 2, 0, 1, out) == 4);
    CHECK(out == std::vector<int32_t>{5});
    // Shorter than n_min, nothing after the match, or max 0: no proposals.
    out.clear();
    CHECK(lookup_proposals(corpus, std::vector<int32_t>{7}, 1, 2, 0, 4, out) == -1);  // 7 ends the corpus
    CHECK(lookup_proposals(corpus, std::vector<int32_t>{5}, 2, 3, 0, 4, out) == -1);
    CHECK(lookup_proposals(corpus, std::vector<int32_t>{3, 4}, 2, 2, 0, 0, out) == -1);
    CHECK(out.empty());
  }

  TEST_CASE("spec_window: starts at the maximum, halves toward a miss, back to the maximum after a full hit") {
    runtime::spec_window w;
    CHECK(w.next(8) == 8);
    w.learn(8, 1, 8);  // a miss after one: accepted + 1 = 2, at least half of 8 = 4
    CHECK(w.next(8) == 4);
    w.learn(4, 0, 8);
    CHECK(w.next(8) == 2);
    w.learn(2, 2, 8);  // everything kept
    CHECK(w.next(8) == 8);
    w.learn(8, 8, 8);
    CHECK(w.next(8) == 8);  // never past the maximum
    CHECK(w.next(3) == 3);  // nor past a smaller one asked for
    w.learn(0, 0, 8);       // nothing proposed: nothing learnt
    CHECK(w.next(8) == 8);
  }

  TEST_CASE("acceptance_record: accepted guesses over judged ones, recent passes weighing most") {
    runtime::acceptance_record r;
    CHECK(r.rate() == -1);
    r.add(0, 0);  // nothing proposed
    CHECK(r.rate() == -1);
    r.add(4, 4);  // four judged, four accepted
    CHECK(r.rate() == doctest::Approx(1.0));
    r.add(4, 1);  // one accepted, then one rejected: two judged (the rest were never reached)
    CHECK(r.rate() == doctest::Approx((0.8 * 4 + 1) / (0.8 * 4 + 2)));
    for (int i = 0; i < 40; ++i) r.add(8, 0);
    CHECK(r.rate() < 0.01);
  }

  TEST_CASE("best_draft_length: the guesses that give the most tokens per time, none when nothing pays") {
    // A free draft: as many as there is room for whenever any guess may be accepted.
    CHECK(runtime::best_draft_length(0.5, 0.0, 8) == 8);
    CHECK(runtime::best_draft_length(0.0, 0.0, 8) == 0);
    // A draft at half a target pass: only a high acceptance pays. At 0.24 (a same-shape Q4_0
    // draft of random weights): 1.24 tokens for 1.5 passes' time, less than a plain pass.
    CHECK(runtime::best_draft_length(0.24, 0.5, 8) == 0);
    const int64_t k = runtime::best_draft_length(0.9, 0.5, 8);
    CHECK(k >= 1);
    CHECK(k <= 4);
    // A cheap draft of a small model: a few guesses even at a modest acceptance.
    CHECK(runtime::best_draft_length(0.6, 0.05, 8) >= 2);
    CHECK(runtime::best_draft_length(0.99, 0.01, 5) == 5);  // never past the room
    CHECK(runtime::best_draft_length(0.9, 0.1, 0) == 0);
  }

  TEST_CASE("ngram_cache: newest output first, bounded in tokens") {
    runtime::ngram_cache c(10);
    std::vector<int32_t> out;
    CHECK_FALSE(c.lookup(std::vector<int32_t>{1, 2}, 2, 3, 4, out));
    c.add(std::vector<int32_t>{1, 2, 3, 4});
    c.add(std::vector<int32_t>{1, 2, 7, 8});
    c.add(std::vector<int32_t>{5});  // too short to propose anything: not kept
    CHECK(c.outputs() == 2);
    CHECK(c.lookup(std::vector<int32_t>{0, 1, 2}, 2, 3, 4, out));
    CHECK(out == std::vector<int32_t>{7, 8});  // the newer output
    // A third output pushes the oldest out (4 + 4 + 4 > 10).
    c.add(std::vector<int32_t>{9, 9, 9, 9});
    CHECK(c.outputs() == 2);
    CHECK(c.tokens() == 8);
    out.clear();
    CHECK_FALSE(c.lookup(std::vector<int32_t>{2, 3}, 2, 3, 4, out));
    // One output longer than the bound keeps its end.
    std::vector<int32_t> longer;
    for (int i = 0; i < 25; ++i) longer.push_back(100 + i);
    c.add(longer);
    CHECK(c.outputs() == 1);
    CHECK(c.tokens() == 10);
    CHECK(c.lookup(std::vector<int32_t>{118, 119}, 2, 2, 3, out));
    CHECK(out == std::vector<int32_t>{120, 121, 122});
    CHECK_FALSE(c.lookup(std::vector<int32_t>{101, 102}, 2, 2, 3, out));
  }
}
