#include <doctest/doctest.h>

#include <string>

#include "tests/test_support.h"

using namespace tandem;

namespace {

// A test data file as one shell word.
std::string quoted_data(const std::string& rel) {
  std::string s(1, '\'');
  s += test::data_path(rel).string();
  s += '\'';
  return s;
}

}  // namespace

TEST_SUITE("tokenize") {
  TEST_CASE("prints the ids as one JSON line") {
    const std::string model = quoted_data("stories260K.gguf");
    auto r = test::run_tandem("tokenize -m " + model + " 'Once upon a time'");
    CHECK(r.exit_code == 0);
    CHECK(r.out == "[1,403,407,261,378]\n");
    r = test::run_tandem("tokenize --no-bos -m " + model + " 'Once upon a time'");
    CHECK(r.out == "[403,407,261,378]\n");
  }

  TEST_CASE("--special parses special tokens") {
    const std::string model = quoted_data("vocab/ggml-vocab-llama-bpe.gguf");
    const std::string text = "'<|start_header_id|>user<|end_header_id|> Hello<|eot_id|>'";
    auto r = test::run_tandem("tokenize --no-bos --special -m " + model + " " + text);
    CHECK(r.exit_code == 0);
    CHECK(r.out == "[128006,882,128007,22691,128009]\n");
    // Without --special the markers are text, and Llama 3 adds BOS by default.
    r = test::run_tandem("tokenize -m " + model + " " + text);
    CHECK(r.exit_code == 0);
    CHECK(r.out.rfind("[128000,", 0) == 0);
    CHECK(r.out.find("128006") == std::string::npos);
  }

  TEST_CASE("errors name the file and key") {
    const auto r = test::run_tandem("tokenize -m " + quoted_data("vocab/ggml-vocab-bert-bge.gguf") + " hi");
    CHECK(r.exit_code == 1);
    CHECK(r.out.empty());
    CHECK(r.err.find("ggml-vocab-bert-bge.gguf") != std::string::npos);
    CHECK(r.err.find("unsupported tokenizer type 'bert'") != std::string::npos);
  }
}
