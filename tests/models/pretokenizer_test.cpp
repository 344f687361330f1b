#include "models/pretokenizer.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <iterator>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "models/unicode.h"

using namespace tandem::models;

namespace {

std::vector<std::string> split(std::string_view pre, std::string_view text) {
  const auto spec = pretokenizer::find_spec(pre);
  REQUIRE(spec);
  const pretokenizer p(spec->regexes);
  std::vector<std::string_view> pieces;
  p.split(text, pieces);
  return {pieces.begin(), pieces.end()};
}

using words = std::vector<std::string>;

}  // namespace

TEST_SUITE("pretokenizer") {
  TEST_CASE("names") {
    CHECK(pretokenizer::find_spec("llama-bpe")->kind == "llama3");
    CHECK(pretokenizer::find_spec("llama-bpe")->ignore_merges);
    CHECK(pretokenizer::find_spec("llama-bpe")->add_bos);
    CHECK(pretokenizer::find_spec("qwen2")->kind == "qwen2");
    CHECK_FALSE(pretokenizer::find_spec("qwen2")->ignore_merges);
    CHECK(pretokenizer::find_spec("")->kind == "default");
    CHECK(pretokenizer::find_spec("smollm")->kind == "starcoder");
    CHECK_FALSE(pretokenizer::find_spec("no-such-pre"));
    const auto names = pretokenizer::known_names();
    CHECK(std::find(names.begin(), names.end(), "deepseek-coder") != names.end());
    CHECK(std::find(names.begin(), names.end(), "") == names.end());
  }

  TEST_CASE("GPT-2 words") {
    CHECK(split("gpt-2", "Hello world's  test!!\n") == words{"Hello", " world", "'s", " ", " test", "!!", "\n"});
    CHECK(split("gpt-2", "abc 123") == words{"abc", " 123"});
    CHECK(split("gpt-2", "").empty());
  }

  TEST_CASE("Llama 3 groups digits by three, Qwen2 splits every digit") {
    CHECK(split("llama-bpe", "12345 x") == words{"123", "45", " x"});
    CHECK(split("qwen2", "123") == words{"1", "2", "3"});
    CHECK(split("llama-bpe", "I'M here\n\n ok") == words{"I", "'M", " here", "\n\n", " ok"});
  }

  TEST_CASE("regex sequences keep matches and the text between them") {
    // starcoder: digits isolated first, then GPT-2 words inside the rest.
    CHECK(split("starcoder", "ab12 c") == words{"ab", "1", "2", " c"});
    // falcon: punctuation runs first, then three-digit groups inside number words.
    CHECK(split("falcon", "x=1234") == words{"x", "=", "123", "4"});
  }

  TEST_CASE("an empty match is a split point") {
    // superbpe marks thousands boundaries with a lookahead that matches nothing.
    CHECK(split("superbpe", "1234567") == words{"1", "234", "567"});
  }

  TEST_CASE("$ means the end of the piece only") {
    // PCRE2's default `$` also matches before a final newline; the lists assume it does not.
    const std::string_view pattern[] = {"x$"};
    const pretokenizer p(pattern);
    std::vector<std::string_view> pieces;
    p.split("x\n", pieces);
    CHECK(pieces == std::vector<std::string_view>{"x\n"});
    p.split("ax", pieces);
    CHECK(pieces == std::vector<std::string_view>{"a", "x"});
    CHECK(split("deepseek-llm", "a  \nb") == words{"a", "  ", "\n", "b"});
  }

  TEST_CASE("pieces always cover the text, for every family") {
    std::mt19937 rng(1234);
    const uint32_t alphabet[] = {'a', 'Z', '0', '7', ' ', '\n', '\t', '\'', '.', '$', 0xE9, 0x416, 0x4E2D, 0xAC00, 0x1F600, 0x2581, 0x3000};
    std::uniform_int_distribution<size_t> pick(0, std::size(alphabet) - 1);
    std::uniform_int_distribution<int> length(0, 40);
    for (auto name : pretokenizer::known_names()) {
      const auto spec = pretokenizer::find_spec(name);
      const pretokenizer p(spec->regexes);
      std::vector<std::string_view> pieces;
      for (int round = 0; round < 50; ++round) {
        std::string text;
        for (int k = length(rng); k > 0; --k) utf8_append(text, alphabet[pick(rng)]);
        p.split(text, pieces);
        std::string joined;
        for (auto w : pieces) {
          CHECK_FALSE(w.empty());
          CHECK(utf8_is_valid(w));
          joined += w;
        }
        INFO("pre: " << std::string(name) << ", text: [" << text << "]");
        CHECK(joined == text);
      }
    }
  }

  TEST_CASE("one pretokenizer splits from several threads at once") {
    const pretokenizer p(pretokenizer::find_spec("llama-bpe")->regexes);
    std::string text;
    for (int k = 0; k < 200; ++k) text += "Hello, world 12345 \xE4\xBD\xA0\xE5\xA5\xBD! ";
    std::vector<std::string_view> expected;
    p.split(text, expected);
    std::vector<int> ok(4, 0);
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&, t] {
        std::vector<std::string_view> got;
        int same = 1;
        for (int k = 0; k < 20; ++k) {
          p.split(text, got);
          same &= got == expected;
        }
        ok[static_cast<size_t>(t)] = same;
      });
    for (auto& th : threads) th.join();
    CHECK(ok == std::vector<int>{1, 1, 1, 1});
  }

  TEST_CASE("a bad pattern names itself") {
    const std::string_view bad[] = {"(unclosed"};
    CHECK_THROWS_WITH_AS(pretokenizer{bad}, doctest::Contains("(unclosed"), std::invalid_argument);
  }
}
