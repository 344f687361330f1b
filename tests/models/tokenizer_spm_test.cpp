#include "models/tokenizer_spm.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

using namespace tandem::models;

namespace {

// A hand-made SentencePiece vocabulary: <unk>, two letters' byte tokens, and scored pieces.
vocab make_vocab(std::vector<std::pair<std::string, float>> pieces, bool with_bytes) {
  vocab_data d;
  d.source = "spm-test";
  d.model = "llama";
  d.tokens = {"<unk>"};
  d.scores = {0};
  d.types = {2};
  if (with_bytes)
    for (const char* b : {"<0xC3>", "<0xA9>"}) {
      d.tokens.push_back(b);
      d.scores.push_back(0);
      d.types.push_back(6);
    }
  for (auto& [text, score] : pieces) {
    d.tokens.push_back(text);
    d.scores.push_back(score);
    d.types.push_back(1);
  }
  d.ids["tokenizer.ggml.unknown_token_id"] = 0;
  return vocab(std::move(d));
}

std::vector<std::string> pieces(const vocab& v, std::string_view text) {
  const spm_tokenizer t(v);
  std::vector<int32_t> ids;
  t.encode(text, ids);
  std::vector<std::string> out;
  for (auto id : ids) out.push_back(v.text(id));
  return out;
}

using strings = std::vector<std::string>;

}  // namespace

TEST_SUITE("tokenizer_spm") {
  TEST_CASE("the highest-scoring pair merges first") {
    const auto v = make_vocab({{"a", 0}, {"b", 0}, {"c", 0}, {"ab", -2}, {"bc", -1}}, false);
    CHECK(pieces(v, "abc") == strings{"a", "bc"});
  }

  TEST_CASE("equal scores merge the leftmost pair") {
    const auto v = make_vocab({{"a", 0}, {"b", 0}, {"c", 0}, {"ab", -1}, {"bc", -1}}, false);
    CHECK(pieces(v, "abc") == strings{"ab", "c"});
  }

  TEST_CASE("merges continue on merged pieces") {
    const auto v = make_vocab({{"a", 0},
                               {"b", 0},
                               {"ab", -1},
                               {"abab", -3},
                               {"\xE2\x96\x81", 0},
                               {"\xE2\x96\x81"
                                "abab",
                                -5}},
                              false);
    CHECK(pieces(v, "abab") == strings{"abab"});
    CHECK(pieces(v, spm_escape_whitespace(" abab")) == strings{"\xE2\x96\x81"
                                                               "abab"});
    CHECK(pieces(v, "ababa") == strings{"abab", "a"});
  }

  TEST_CASE("byte fallback") {
    SUBCASE("characters without a piece become their byte tokens") {
      const auto v = make_vocab({{"a", 0}}, true);
      CHECK(pieces(v, "a\xC3\xA9") == strings{"a", "<0xC3>", "<0xA9>"});
    }
    SUBCASE("and the unknown token when a byte token is missing") {
      const auto v = make_vocab({{"a", 0}}, false);
      CHECK(pieces(v, "a\xC3\xA9") == strings{"a", "<unk>", "<unk>"});
    }
    SUBCASE("invalid bytes are single symbols") {
      const auto v = make_vocab({{"a", 0}}, true);
      CHECK(pieces(v,
                   "\xA9"
                   "a\xC3") == strings{"<0xA9>", "a", "<0xC3>"});
    }
  }

  TEST_CASE("whitespace escaping") {
    CHECK(spm_escape_whitespace(" a  b") ==
          "\xE2\x96\x81"
          "a"
          "\xE2\x96\x81\xE2\x96\x81"
          "b");
    CHECK(spm_unescape_whitespace("\xE2\x96\x81"
                                  "a"
                                  "\xE2\x96\x81") == " a ");
    CHECK(spm_escape_whitespace("\t\n") == "\t\n");
  }

  TEST_CASE("long input stays fast") {
    const auto v = make_vocab({{"a", 0}, {"b", 0}, {"ab", -1}, {"abab", -3}}, false);
    std::string text;
    for (int k = 0; k < 50000; ++k) text += "ab";
    const auto p = pieces(v, text);
    CHECK(p.size() == 25000);
    CHECK(p.front() == "abab");
  }
}
