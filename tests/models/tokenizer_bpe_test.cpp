#include "models/tokenizer_bpe.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace tandem::models;

namespace {

vocab make_vocab(std::vector<std::string> tokens, std::vector<std::string> merges, bool with_unk = false) {
  vocab_data d;
  d.source = "bpe-test";
  d.model = "gpt2";
  d.tokens = std::move(tokens);
  d.merges = std::move(merges);
  if (with_unk) {
    d.tokens.push_back("<unk>");
    d.types.assign(d.tokens.size(), 1);
    d.types.back() = 2;
    d.ids["tokenizer.ggml.unknown_token_id"] = static_cast<int64_t>(d.tokens.size() - 1);
  }
  return vocab(std::move(d));
}

std::vector<std::string> pieces(const vocab& v, std::string_view word, bool ignore_merges = false) {
  const bpe_tokenizer t(v, ignore_merges);
  std::vector<int32_t> ids;
  t.encode_word(word, ids);
  std::vector<std::string> out;
  for (auto id : ids) out.push_back(v.text(id));
  return out;
}

using strings = std::vector<std::string>;

}  // namespace

TEST_SUITE("tokenizer_bpe") {
  TEST_CASE("lowest rank merges first") {
    const auto v = make_vocab({"a", "b", "c", "ab", "bc", "abc"}, {"b c", "a b", "a bc"});
    CHECK(pieces(v, "abc") == strings{"abc"});
    const auto w = make_vocab({"a", "b", "c", "ab", "bc", "abc"}, {"a b", "b c", "ab c"});
    CHECK(pieces(w, "abc") == strings{"abc"});
    const auto x = make_vocab({"a", "b", "c", "ab", "bc"}, {"b c", "a b"});
    CHECK(pieces(x, "abc") == strings{"a", "bc"});
  }

  TEST_CASE("equal pairs merge left to right") {
    const auto v = make_vocab({"a", "aa"}, {"a a"});
    CHECK(pieces(v, "aaa") == strings{"aa", "a"});
  }

  TEST_CASE("words are byte-encoded first") {
    // " a" is spelled "Ġa" in the byte-level alphabet.
    const auto v = make_vocab({"\xC4\xA0", "a",
                               "\xC4\xA0"
                               "a"},
                              {"\xC4\xA0 a"});
    CHECK(pieces(v, " a") == strings{"\xC4\xA0"
                                     "a"});
  }

  TEST_CASE("ignore_merges emits a word that is a token whole") {
    // No merge path leads to "abc", but the vocabulary has it.
    const auto v = make_vocab({"a", "b", "c", "abc"}, {});
    CHECK(pieces(v, "abc", false) == strings{"a", "b", "c"});
    CHECK(pieces(v, "abc", true) == strings{"abc"});
  }

  TEST_CASE("bad merges are skipped, not fatal") {
    const auto v = make_vocab({"a", "b", "ab"}, {"nospace", "x y", "a q", "a b", "a b", "b a", " "});
    const bpe_tokenizer t(v, false);
    CHECK(t.merge_count() == 1);     // "a b" (its repeat keeps the first rank)
    CHECK(t.skipped_merges() == 5);  // no separator, unknown parts, result "ba" not a token
    CHECK(pieces(v, "abba") == strings{"ab", "b", "a"});
  }

  TEST_CASE("characters missing from the vocabulary") {
    CHECK(pieces(make_vocab({"a"}, {}, true), "a!") == strings{"a", "<unk>"});
    CHECK(pieces(make_vocab({"a"}, {}, false), "a!") == strings{"a"});
  }

  TEST_CASE("byte encoding round trip") {
    std::string all;
    for (int b = 0; b < 256; ++b) all += static_cast<char>(b);
    const std::string enc = byte_encode(all);
    CHECK(enc.size() > all.size());
    CHECK(byte_decode(enc) == all);
    CHECK(byte_encode(" \n") == "\xC4\xA0\xC4\x8A");
    // Characters outside the alphabet (literal text in some vocabularies) pass through.
    CHECK(byte_decode("\xE4\xB8\xAD") == "\xE4\xB8\xAD");
  }
}
