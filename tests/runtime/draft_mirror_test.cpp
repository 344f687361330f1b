// A draft's mirror of a target sequence: fed tokens catch up with the history, proposals turn
// into target tokens, and resync keeps what agrees, for the same and for another vocabulary.
#include "runtime/draft_mirror.h"

#include <doctest/doctest.h>

#include "models/gguf_reader.h"
#include "tests/test_support.h"

using namespace tandem;

namespace {

models::tokenizer load(const std::string& rel) {
  const models::gguf_file f(test::data_path(rel).string());
  return models::tokenizer::from_gguf(f);
}

std::string spelled(const models::tokenizer& t, const std::vector<int32_t>& ids) {
  std::string s;
  for (const int32_t id : ids) s += t.token_to_piece(id, false);
  return s;
}

}  // namespace

TEST_SUITE("draft_mirror") {
  TEST_CASE("vocabularies: the same file's is the same, another's is not; both spell any text") {
    const auto spm = load("stories260K.gguf");
    const auto spm2 = load("stories260K-q8_0.gguf");
    const auto bpe = load("vocab/ggml-vocab-gpt-2.gguf");
    CHECK(runtime::same_vocabulary(spm, spm2));
    CHECK_FALSE(runtime::same_vocabulary(spm, bpe));
    CHECK(spm.encodes_any_text());
    CHECK(bpe.encodes_any_text());
    // A continuation takes no space prefix and no BOS.
    const auto ids = spm.encode_continuation("lo there");
    CHECK(spm.decode(ids, false) == "lo there");
    CHECK(ids.front() != spm.bos());
    CHECK(spelled(spm, ids) == "lo there");
  }

  TEST_CASE("same vocabulary: catch up in chunks, propose, keep the agreeing prefix") {
    const auto tok = load("stories260K.gguf");
    const runtime::draft_vocab v{&tok, nullptr};
    runtime::draft_mirror m;
    runtime::start_mirror(m, v);
    const std::vector<int32_t> history{1, 50, 60, 70, 80, 90};
    std::vector<int32_t> feed;
    CHECK_FALSE(runtime::catch_up(m, v, history, 4, feed));  // a chunk of 4: not level yet
    CHECK(feed == std::vector<int32_t>{1, 50, 60, 70});
    runtime::commit_fed(m, v, feed);
    feed.clear();
    CHECK(runtime::catch_up(m, v, history, 4, feed));
    CHECK(feed == std::vector<int32_t>{80, 90});
    runtime::commit_fed(m, v, feed);
    // Guesses 5, 6, 7: 5 and 6 fed while guessing; the target takes 5 then says 9.
    std::vector<int32_t> out;
    runtime::to_target(v, std::vector<int32_t>{5, 6, 7}, 2, out);
    CHECK(out == std::vector<int32_t>{5, 6});
    m.fed.push_back(5);
    m.fed.push_back(6);
    auto after = history;
    after.push_back(5);
    after.push_back(9);
    runtime::resync(m, v, after);
    CHECK(m.fed == std::vector<int32_t>{1, 50, 60, 70, 80, 90, 5});
    feed.clear();
    CHECK(runtime::catch_up(m, v, after, 8, feed));
    CHECK(feed == std::vector<int32_t>{9});
    // Everything already fed: the last token is fed again for its logits.
    runtime::commit_fed(m, v, feed);
    feed.clear();
    CHECK(runtime::catch_up(m, v, after, 8, feed));
    CHECK(feed == std::vector<int32_t>{9});
    CHECK(m.fed.size() == after.size() - 1);
  }

  TEST_CASE("another vocabulary: the draft is fed the target's text and its guesses come back as target tokens") {
    const auto target = load("stories260K.gguf");
    const auto draft = load("vocab/ggml-vocab-gpt-2.gguf");
    const runtime::draft_vocab v{&target, &draft};
    runtime::draft_mirror m;
    runtime::start_mirror(m, v);
    const std::string story = "Once upon a time, there was a little girl";
    auto history = target.encode(story, true, false);
    std::vector<int32_t> feed;
    CHECK(runtime::catch_up(m, v, history, 100, feed));
    runtime::commit_fed(m, v, feed);
    // The draft saw the text as the target renders it (SPM's leading space included).
    CHECK(spelled(draft, m.fed) == m.text);
    CHECK(m.covered == m.text.size());
    // The draft guesses " named Lily": target tokens for it, the last one dropped (it may
    // end inside a longer target token).
    const auto guesses = draft.encode_continuation(" named Lily");
    std::vector<int32_t> proposal;
    runtime::to_target(v, guesses, 16, proposal);
    const auto whole = target.encode_continuation(" named Lily");
    REQUIRE(whole.size() >= 2);
    CHECK(proposal == std::vector<int32_t>(whole.begin(), whole.end() - 1));
    // Fed while guessing: all but the last guess. The target accepts " named" and says " Sue".
    for (size_t i = 0; i + 1 < guesses.size(); ++i) m.fed.push_back(guesses[i]);
    const size_t before = m.base;
    auto after = history;
    for (const int32_t id : target.encode_continuation(" named Sue")) after.push_back(id);
    runtime::resync(m, v, after);
    CHECK(m.fed.size() == before + 1);  // " named" agrees, " Lily" does not
    CHECK(spelled(draft, m.fed) == m.text.substr(0, m.covered));
    feed.clear();
    CHECK(runtime::catch_up(m, v, after, 100, feed));
    CHECK(spelled(draft, feed) == " Sue");
    runtime::commit_fed(m, v, feed);
    CHECK(m.covered == m.text.size());
  }

  TEST_CASE("another vocabulary: a character split across target tokens waits until it is whole") {
    const auto target = load("stories260K.gguf");
    const auto draft = load("vocab/ggml-vocab-gpt-2.gguf");
    const runtime::draft_vocab v{&target, &draft};
    runtime::draft_mirror m;
    runtime::start_mirror(m, v);
    // "é" as two byte tokens of the SPM vocabulary, the second not yet generated.
    auto history = target.encode("caf", true, false);
    const auto c3 = target.find("<0xC3>"), a9 = target.find("<0xA9>");
    REQUIRE(c3);
    REQUIRE(a9);
    const std::vector<int32_t> e_bytes{*c3, *a9};
    history.push_back(e_bytes[0]);
    std::vector<int32_t> feed;
    CHECK_FALSE(runtime::catch_up(m, v, history, 100, feed));  // not level: half a character held back
    runtime::commit_fed(m, v, feed);
    CHECK(spelled(draft, m.fed).find("caf") != std::string::npos);
    history.push_back(e_bytes[1]);
    feed.clear();
    CHECK(runtime::catch_up(m, v, history, 100, feed));
    runtime::commit_fed(m, v, feed);
    CHECK(m.covered == m.text.size());
    CHECK(spelled(draft, m.fed) == m.text);
  }
}
