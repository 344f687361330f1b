#include "models/tokenizer.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "models/gguf_reader.h"
#include "tests/test_support.h"

using namespace tandem;

namespace {

models::tokenizer load(const std::string& name) {
  models::gguf_file f(test::data_path(name).string());
  return models::tokenizer::from_gguf(f);
}

}  // namespace

TEST_SUITE("tokenizer_stream") {
  const std::string llama = "\xF0\x9F\xA6\x99";  // U+1F999, not a piece: four byte tokens

  TEST_CASE("a character split over byte tokens is held back until complete") {
    const auto tok = load("vocab/ggml-vocab-llama-spm.gguf");
    const auto ids = tok.encode("a" + llama + "b", false, false);
    const auto b0 = *tok.find("<0xF0>"), b1 = *tok.find("<0x9F>"), b2 = *tok.find("<0xA6>"), b3 = *tok.find("<0x99>");
    const std::vector<int32_t> expected_tail = {b0, b1, b2, b3};
    REQUIRE(ids.size() == 6);
    CHECK(std::vector<int32_t>(ids.begin() + 1, ids.begin() + 5) == expected_tail);

    models::detokenizer_stream s(tok);
    CHECK(s.push(ids[0]) == " a");
    CHECK(s.push(b0).empty());
    CHECK(s.push(b1).empty());
    CHECK(s.push(b2).empty());
    CHECK(s.pending_bytes() == 3);
    CHECK(s.push(b3) == llama);
    CHECK(s.pending_bytes() == 0);
    CHECK(s.push(ids[5]) == "b");
    CHECK(s.flush().empty());
  }

  TEST_CASE("flush replaces an unfinished character") {
    const auto tok = load("vocab/ggml-vocab-llama-spm.gguf");
    models::detokenizer_stream s(tok);
    CHECK(s.push(*tok.find("<0xF0>")).empty());
    CHECK(s.push(*tok.find("<0x9F>")).empty());
    CHECK(s.flush() == "\xEF\xBF\xBD");
    CHECK(s.flush().empty());
    // Bytes that can never start a character are replaced at once, not held.
    CHECK(s.push(*tok.find("<0xFF>")) == "\xEF\xBF\xBD");
    CHECK(s.push(*tok.find("<0x41>")) == "A");
  }

  TEST_CASE("byte-level BPE: emoji spread over tokens") {
    const auto tok = load("vocab/ggml-vocab-gpt-2.gguf");
    const std::string text = "Hi " + llama + llama + " ok";
    const auto ids = tok.encode(text, false, false);
    models::detokenizer_stream s(tok);
    std::string out;
    for (auto id : ids) {
      const std::string part = s.push(id);
      // Every chunk handed out is complete UTF-8 on its own.
      CHECK(part == std::string(part).c_str());
      out += part;
    }
    out += s.flush();
    CHECK(out == text);
  }

  TEST_CASE("control tokens are hidden unless asked for") {
    const auto tok = load("vocab/ggml-vocab-qwen2.5-coder.gguf");
    models::detokenizer_stream hidden(tok);
    CHECK(hidden.push(151644).empty());
    CHECK(hidden.push(9707) == "Hello");
    models::detokenizer_stream shown(tok, /*render_special=*/true);
    CHECK(shown.push(151644) == "<|im_start|>");
  }
}
