#include "models/vocab.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "models/gguf_reader.h"
#include "models/gguf_writer.h"
#include "models/tokenizer.h"
#include "tests/test_support.h"

using namespace tandem;
using namespace tandem::models;

namespace {

vocab_data small_data() {
  vocab_data d;
  d.source = "small.gguf";
  d.model = "gpt2";
  d.pre = "gpt-2";
  d.tokens = {"a", "b", "ab", "<|im_end|>", "<s>", "<tool>", "<tool_call>", "<unk>"};
  d.types = {1, 1, 1, 1, 3, 4, 4, 2};
  d.merges = {"a b"};
  d.ids[std::string(k_key_bos)] = 4;
  d.ids[std::string(k_key_eos)] = 4;
  d.ids[std::string(k_key_unk)] = 7;
  return d;
}

// The message of the gguf_error thrown by building a vocab from `d`.
std::string error_of(vocab_data d) {
  try {
    vocab v(std::move(d));
  } catch (const gguf_error& e) {
    return e.what();
  }
  return "no error";
}

// A GGUF file holding only tokenizer metadata, written with the project's writer.
std::string write_vocab_file(const test::scratch_dir& dir, const std::function<void(gguf_writer&)>& edit) {
  gguf_writer w;
  w.set("general.architecture", gguf_out_value::string("llama"));
  w.set("tokenizer.ggml.model", gguf_out_value::string("llama"));
  w.set("tokenizer.ggml.tokens", gguf_out_value::strings({"<unk>", "<s>", "</s>",
                                                          "\xE2\x96\x81"
                                                          "a",
                                                          "a"}));
  w.set("tokenizer.ggml.scores", gguf_out_value::array(std::vector<float>{0, 0, 0, -1, -2}));
  w.set("tokenizer.ggml.token_type", gguf_out_value::array(std::vector<int32_t>{2, 3, 3, 1, 1}));
  w.set("tokenizer.ggml.bos_token_id", gguf_out_value::u32(1));
  w.set("tokenizer.ggml.eos_token_id", gguf_out_value::u32(2));
  edit(w);
  const std::string path = (dir / "vocab.gguf").string();
  w.write(path);
  return path;
}

std::string load_error(const std::string& path) {
  try {
    gguf_file f(path);
    (void)tokenizer::from_gguf(f);
  } catch (const gguf_error& e) {
    return e.what();
  }
  return "no error";
}

}  // namespace

TEST_SUITE("vocab") {
  TEST_CASE("lookups and special ids") {
    const vocab v(small_data());
    CHECK(v.size() == 8);
    CHECK(v.find("ab") == 2);
    CHECK_FALSE(v.find("ba"));
    CHECK(v.bos() == 4);
    CHECK(v.eos() == 4);
    CHECK(v.unk() == 7);
    CHECK(v.pad() == -1);
    CHECK(v.type(4) == token_type::control);
    CHECK(v.score(0) == 0.0f);  // no scores stored
    // EOT comes from the well-known text when the key is absent; it also ends generation
    // and is promoted to a control token.
    CHECK(v.eot() == 3);
    CHECK(v.is_eog(3));
    CHECK(v.is_eog(4));
    CHECK_FALSE(v.is_eog(0));
    CHECK(v.type(3) == token_type::control);
  }

  TEST_CASE("special-token matching") {
    const vocab v(small_data());
    const std::string text = "x<tool_call><s><unk>";
    CHECK_FALSE(v.match_special(text, 0, true));
    CHECK(v.match_special(text, 1, false) == 6);              // user-defined: always, longest first
    CHECK(v.match_special(text, 12, false) == std::nullopt);  // control: only when parsing
    CHECK(v.match_special(text, 12, true) == 4);
    CHECK(v.match_special(text, 15, true) == 7);  // unknown behaves as control
  }

  TEST_CASE("repeated texts resolve to the last id, as llama.cpp") {
    auto d = small_data();
    d.tokens[1] = d.tokens[0];
    const vocab v(std::move(d));
    CHECK(v.find("a") == 1);
  }

  TEST_CASE("absent ids written as -1 or 0xFFFFFFFF") {
    auto d = small_data();
    d.ids[std::string(k_key_pad)] = 0xFFFFFFFFll;
    d.ids["tokenizer.ggml.seperator_token_id"] = -1;
    const vocab v(std::move(d));
    CHECK(v.pad() == -1);
  }

  TEST_CASE("malformed metadata is refused with the file and key") {
    SUBCASE("no tokens") {
      auto d = small_data();
      d.tokens.clear();
      d.types.clear();
      CHECK(error_of(d) == "small.gguf: tokenizer.ggml.tokens: empty token list");
    }
    SUBCASE("scores of another length") {
      auto d = small_data();
      d.scores = {0, 0};
      CHECK(error_of(d) == "small.gguf: tokenizer.ggml.scores: 2 scores for 8 tokens");
    }
    SUBCASE("types of another length") {
      auto d = small_data();
      d.types.pop_back();
      CHECK(error_of(d) == "small.gguf: tokenizer.ggml.token_type: 7 types for 8 tokens");
    }
    SUBCASE("unknown type") {
      auto d = small_data();
      d.types[2] = 9;
      CHECK(error_of(d) == "small.gguf: tokenizer.ggml.token_type: token 2 has unknown type 9");
    }
    SUBCASE("special id outside the vocabulary") {
      auto d = small_data();
      d.ids[std::string(k_key_eos)] = 8;
      CHECK(error_of(d) == "small.gguf: tokenizer.ggml.eos_token_id: token id 8 is outside the vocabulary of 8");
      d = small_data();
      d.ids["tokenizer.ggml.fim_pre_token_id"] = 1000000;
      CHECK(error_of(d).find("tokenizer.ggml.fim_pre_token_id") != std::string::npos);
    }
    SUBCASE("unknown pre-tokenizer") {
      auto d = small_data();
      d.pre = "made-up";
      try {
        (void)tokenizer::from_data(d);
        FAIL("expected an error");
      } catch (const gguf_error& e) {
        const std::string msg = e.what();
        CHECK(msg.find("small.gguf: tokenizer.ggml.pre: unknown pre-tokenizer 'made-up'") == 0);
        CHECK(msg.find("llama-bpe") != std::string::npos);
      }
    }
  }

  TEST_CASE("reading from GGUF files") {
    SUBCASE("stories260K: a u32 0xFFFFFFFF id means absent") {
      gguf_file f(test::data_path("stories260K.gguf").string());
      const auto d = read_vocab_data(f);
      CHECK(d.model == "llama");
      CHECK(d.tokens.size() == 512);
      CHECK(d.scores.size() == 512);
      CHECK(d.ids.at("tokenizer.ggml.padding_token_id") == 0xFFFFFFFFll);
      const vocab v(d);
      CHECK(v.pad() == -1);
      CHECK(v.bos() == 1);
    }
    test::scratch_dir dir;
    SUBCASE("a well-formed file loads") {
      const auto path = write_vocab_file(dir, [](gguf_writer&) {});
      gguf_file f(path);
      const auto t = tokenizer::from_gguf(f);
      CHECK(t.n_vocab() == 5);
      CHECK(t.encode("a", true, false) == std::vector<int32_t>{1, 3});
    }
    SUBCASE("scores shorter than tokens") {
      const auto path = write_vocab_file(dir, [](gguf_writer& w) {
        w.set("tokenizer.ggml.scores", gguf_out_value::array(std::vector<float>{0, 0}));
      });
      const auto msg = load_error(path);
      CHECK(msg.find("vocab.gguf") != std::string::npos);
      CHECK(msg.find("tokenizer.ggml.scores: 2 scores for 5 tokens") != std::string::npos);
    }
    SUBCASE("tokens of the wrong type") {
      const auto path = write_vocab_file(dir, [](gguf_writer& w) {
        w.set("tokenizer.ggml.tokens", gguf_out_value::array(std::vector<int32_t>{1, 2, 3, 4, 5}));
      });
      const auto msg = load_error(path);
      CHECK(msg.find("tokenizer.ggml.tokens") != std::string::npos);
      CHECK(msg.find("expected an array of strings") != std::string::npos);
    }
    SUBCASE("BOS id out of range") {
      const auto path = write_vocab_file(dir, [](gguf_writer& w) { w.set("tokenizer.ggml.bos_token_id", gguf_out_value::u32(5)); });
      CHECK(load_error(path).find("tokenizer.ggml.bos_token_id: token id 5 is outside the vocabulary of 5") != std::string::npos);
    }
    SUBCASE("no tokenizer at all") {
      gguf_writer w;
      w.set("general.architecture", gguf_out_value::string("llama"));
      const std::string path = (dir / "empty.gguf").string();
      w.write(path);
      const auto msg = load_error(path);
      CHECK(msg.find("empty.gguf") != std::string::npos);
      CHECK(msg.find("tokenizer.ggml.model") != std::string::npos);
    }
    SUBCASE("unsupported type names the supported ones") {
      const auto path = write_vocab_file(dir, [](gguf_writer& w) { w.set("tokenizer.ggml.model", gguf_out_value::string("t5")); });
      CHECK(load_error(path).find("tokenizer.ggml.model: unsupported tokenizer type 't5' (supported: llama, gpt2)") != std::string::npos);
    }
  }
}
