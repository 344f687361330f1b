#include "models/tokenizer.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "models/gguf_reader.h"
#include "tests/test_support.h"

using namespace tandem;

namespace {

struct vocab_case {
  std::string text;
  std::vector<int32_t> ids;
};

// llama.cpp's vocabulary test format: inputs separated by "\n__ggml_vocab_test__\n" (the
// file ends with a separator), one line of space-separated ids per input.
std::vector<vocab_case> read_cases(const std::string& name) {
  const std::string inp = test::read_file(test::data_path("vocab/" + name + ".inp"));
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<vocab_case> cases;
  for (size_t pos = 0; pos < inp.size();) {
    const size_t next = inp.find(sep, pos);
    if (next == std::string::npos) {
      cases.push_back({inp.substr(pos), {}});
      break;
    }
    cases.push_back({inp.substr(pos, next - pos), {}});
    pos = next + sep.size();
  }
  std::istringstream out(test::read_file(test::data_path("vocab/" + name + ".out")));
  std::string line;
  for (auto& c : cases) {
    REQUIRE(std::getline(out, line));
    std::istringstream ids(line);
    for (int32_t id; ids >> id;) c.ids.push_back(id);
  }
  return cases;
}

// Loaded once per file: tokenizers are immutable and cheap to copy, and the large
// vocabularies take a moment to load.
models::tokenizer load(const std::string& name) {
  static std::map<std::string, models::tokenizer> cache;
  if (auto it = cache.find(name); it != cache.end()) return it->second;
  models::gguf_file f(test::data_path("vocab/" + name).string());
  return cache.emplace(name, models::tokenizer::from_gguf(f)).first->second;
}

std::string ids_string(const std::vector<int32_t>& ids) {
  std::string s;
  for (auto id : ids) {
    s += ' ';
    s += std::to_string(id);
  }
  return s;
}

}  // namespace

TEST_SUITE("tokenizer") {
  TEST_CASE("llama.cpp vocabulary test vectors") {
    // Every vocabulary of a supported type; bert-bge (WordPiece) is checked below to fail
    // cleanly instead.
    const char* files[] = {
        "ggml-vocab-llama-spm.gguf", "ggml-vocab-phi-3.gguf",         "ggml-vocab-gpt-2.gguf",          "ggml-vocab-llama-bpe.gguf",
        "ggml-vocab-qwen2.gguf",     "ggml-vocab-qwen2.5-coder.gguf", "ggml-vocab-deepseek-coder.gguf", "ggml-vocab-deepseek-llm.gguf",
        "ggml-vocab-falcon.gguf",    "ggml-vocab-mpt.gguf",           "ggml-vocab-refact.gguf",         "ggml-vocab-starcoder.gguf",
    };
    for (const char* name : files) {
      SUBCASE(name) {
        const auto tok = load(name);
        const auto cases = read_cases(name);
        CHECK(cases.size() == 46);
        int passed = 0;
        for (const auto& c : cases) {
          const auto ids = tok.encode(c.text, /*add_bos=*/false, /*parse_special=*/false);
          INFO("input: [" << c.text << "]");
          CHECK(ids_string(ids) == ids_string(c.ids));
          passed += ids == c.ids;
        }
        MESSAGE(std::string(name) << ": " << passed << "/" << cases.size() << " pass");
      }
    }
  }

  TEST_CASE("round trip: decode(encode(s)) == s") {
    for (const char* name : {"ggml-vocab-llama-spm.gguf", "ggml-vocab-phi-3.gguf", "ggml-vocab-gpt-2.gguf", "ggml-vocab-llama-bpe.gguf",
                             "ggml-vocab-qwen2.gguf", "ggml-vocab-deepseek-llm.gguf", "ggml-vocab-falcon.gguf", "ggml-vocab-starcoder.gguf"}) {
      SUBCASE(name) {
        const auto tok = load(name);
        for (const auto& c : read_cases(name)) {
          INFO("input: [" << c.text << "]");
          CHECK(tok.decode(tok.encode(c.text, false, false)) == c.text);
          // With BOS: hidden when special tokens are not rendered; SPM's space prefix is
          // still undone on the first text token.
          if (tok.bos() >= 0) {
            const auto with_bos = tok.encode(c.text, true, false);
            REQUIRE(!with_bos.empty());
            CHECK(with_bos[0] == tok.bos());
            CHECK(tok.decode(with_bos, /*render_special=*/false) == c.text);
          }
        }
      }
    }
  }

  TEST_CASE("special tokens") {
    SUBCASE("Qwen") {
      const auto tok = load("ggml-vocab-qwen2.5-coder.gguf");
      CHECK(tok.encode("Hello world", false, false) == std::vector<int32_t>{9707, 1879});
      CHECK(tok.type_name() == "gpt2");
      CHECK(tok.pre_name() == "qwen2");
      CHECK(!tok.add_bos());
      CHECK(tok.find("<|im_start|>") == 151644);
      CHECK(tok.find("<|fim_prefix|>") == 151659);
      // Parsed when asked; otherwise the same text is ordinary characters.
      const auto parsed = tok.encode("<|im_start|>user\nHi<|im_end|>", false, true);
      REQUIRE(parsed.size() >= 3);
      CHECK(parsed.front() == 151644);
      CHECK(parsed.back() == 151645);
      const auto literal = tok.encode("<|im_start|>", false, false);
      CHECK(literal.size() > 1);
      CHECK(std::find(literal.begin(), literal.end(), 151644) == literal.end());
      // End of generation: eos and the end-of-turn text, but not ordinary tokens.
      CHECK(tok.is_eog(151643));
      CHECK(tok.is_eog(151645));
      CHECK(tok.is_eog(151662));  // fim_pad, as llama.cpp
      CHECK_FALSE(tok.is_eog(9707));
      CHECK(tok.is_control(151644));
      CHECK_FALSE(tok.is_control(9707));
      // USER_DEFINED added tokens are matched even without parse_special.
      CHECK(tok.encode("<tool_call>", false, false) == std::vector<int32_t>{151657});
      CHECK(tok.token_to_piece(151644) == "<|im_start|>");
      CHECK(tok.token_to_piece(151644, false).empty());
    }
    SUBCASE("Llama 3") {
      const auto tok = load("ggml-vocab-llama-bpe.gguf");
      CHECK(tok.encode("Hello world", false, false) == std::vector<int32_t>{9906, 1917});
      CHECK(tok.add_bos());
      CHECK(tok.bos() == 128000);
      CHECK(tok.encode("Hello world", true, false) == std::vector<int32_t>{128000, 9906, 1917});
      CHECK(tok.encode("<|start_header_id|>user<|end_header_id|> Hello<|eot_id|>", false, true) ==
            std::vector<int32_t>{128006, 882, 128007, 22691, 128009});
      CHECK(tok.eot() == 128009);  // found by its text: the file has no eot_token_id
      CHECK(tok.is_eog(128009));
      CHECK(tok.is_eog(128001));
      CHECK_FALSE(tok.is_eog(128006));
    }
    SUBCASE("SPM: space prefix after a special token") {
      const auto tok = load("ggml-vocab-llama-spm.gguf");
      CHECK(tok.type_name() == "llama");
      CHECK(tok.add_bos());
      const auto a = tok.encode("Hello", false, false);
      const auto b = tok.encode("</s>Hello", false, true);
      REQUIRE(b.size() == a.size() + 1);
      CHECK(b[0] == 2);
      CHECK(std::vector<int32_t>(b.begin() + 1, b.end()) == a);
      CHECK(tok.encode("", true, false) == std::vector<int32_t>{1});
      CHECK(tok.encode("", false, false).empty());
    }
  }

  TEST_CASE("pieces") {
    const auto spm = load("ggml-vocab-llama-spm.gguf");
    CHECK(spm.token_to_piece(*spm.find("<0x0A>")) == "\n");
    CHECK(spm.token_to_piece(*spm.find("\xE2\x96\x81Hello")) == " Hello");
    CHECK(spm.token_to_piece(-1).empty());
    CHECK(spm.token_to_piece(spm.n_vocab()).empty());
    const auto bpe = load("ggml-vocab-gpt-2.gguf");
    CHECK(bpe.token_to_piece(*bpe.find("\xC4\xA0world")) == " world");  // "Ġworld"
    CHECK(bpe.token_to_piece(*bpe.find("\xC4\x8A")) == "\n");           // "Ċ"
  }

  TEST_CASE("invalid UTF-8 is encoded, not rejected") {
    const std::string bad = "a\xFF\xC3(b\xF0\x9F";
    const auto spm = load("ggml-vocab-llama-spm.gguf");
    // SPM keeps the bytes (byte fallback), so they come back exactly.
    CHECK(spm.decode(spm.encode(bad, false, false)) == bad);
    const auto bpe = load("ggml-vocab-gpt-2.gguf");
    CHECK(bpe.decode(bpe.encode(bad, false, false)) == "a\xEF\xBF\xBD\xEF\xBF\xBD(b\xEF\xBF\xBD");
  }

  TEST_CASE("bert vocabularies are refused with the list of supported types") {
    models::gguf_file f(test::data_path("vocab/ggml-vocab-bert-bge.gguf").string());
    try {
      (void)models::tokenizer::from_gguf(f);
      FAIL("expected an error");
    } catch (const models::gguf_error& e) {
      const std::string msg = e.what();
      CHECK(msg.find("ggml-vocab-bert-bge.gguf") != std::string::npos);
      CHECK(msg.find("tokenizer.ggml.model") != std::string::npos);
      CHECK(msg.find("'bert'") != std::string::npos);
      CHECK(msg.find("llama, gpt2") != std::string::npos);
    }
  }

  TEST_CASE("encoding 10 KB takes milliseconds") {
    std::string text;
    const auto cases = read_cases("ggml-vocab-llama-bpe.gguf");
    while (text.size() < 10240)
      for (const auto& c : cases) text += c.text + " ";
    for (const char* name : {"ggml-vocab-llama-bpe.gguf", "ggml-vocab-llama-spm.gguf", "ggml-vocab-deepseek-llm.gguf"}) {
      const auto tok = load(name);
      const auto t0 = std::chrono::steady_clock::now();
      const auto ids = tok.encode(text, false, true);
      const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
      MESSAGE(std::string(name) << ": " << text.size() << " bytes -> " << ids.size() << " tokens in " << ms << " ms");
      CHECK(ids.size() > 1000);
      CHECK(ms < 500);  // generous for sanitizer builds; release takes a few ms
      CHECK(tok.decode(ids) == text);
    }
  }

  TEST_CASE("pathological inputs stay fast") {
    // Long runs that make one huge word or one long regex match, and random bytes.
    std::mt19937 rng(42);
    constexpr size_t n = 20000;
    std::string random_bytes(n, '\0');
    for (auto& c : random_bytes) c = static_cast<char>(rng() & 0xFF);
    const std::string inputs[] = {std::string(n, 'a'),        std::string(n, ' '),  std::string(n, '7'),
                                  std::string(n, '\n') + "x", std::string(n, '\''), random_bytes};
    for (const char* name :
         {"ggml-vocab-llama-bpe.gguf", "ggml-vocab-llama-spm.gguf", "ggml-vocab-gpt-2.gguf", "ggml-vocab-deepseek-llm.gguf", "ggml-vocab-mpt.gguf"}) {
      const auto tok = load(name);
      for (const auto& text : inputs) {
        const auto t0 = std::chrono::steady_clock::now();
        const auto ids = tok.encode(text, false, true);
        const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
        INFO(name << ", input starting with byte " << int(static_cast<uint8_t>(text[0])) << ": " << ms << " ms");
        CHECK(!ids.empty());
        CHECK(ms < 2000);  // ~10 ms in release builds; generous for sanitizer builds
      }
    }
  }
}
