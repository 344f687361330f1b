// `tandem run` end to end: the real binary on the committed test model and on SmolLM2.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "tests/test_support.h"

using namespace tandem;

namespace {
nlohmann::json fixture(const std::string& name) {
  return nlohmann::json::parse(test::read_file(test::data_path("reference/" + name)));
}
}  // namespace

TEST_SUITE("run") {
  TEST_CASE("stories260K greedy writes exactly llama.cpp's text to stdout and timings to stderr") {
    const auto ref = fixture("stories260K-greedy.json");
    const auto r = test::run_tandem("run -m '" + test::data_path("stories260K.gguf").string() + "' -p 'Once upon a time' -n 48 --temp 0");
    REQUIRE(r.exit_code == 0);
    CHECK(r.out == ref["generated_text"].get<std::string>() + "\n");
    CHECK(r.err.find("prompt: 5 tokens") != std::string::npos);
    CHECK(r.err.find("generated: 48 tokens") != std::string::npos);
  }

  TEST_CASE("a seed makes sampling repeatable; different seeds differ") {
    const std::string base = "run -m '" + test::data_path("stories260K.gguf").string() + "' -p 'Once upon a time' -n 40 --temp 1.2 --top-k 0 --top-p 1 --min-p 0 --seed ";
    const auto a = test::run_tandem(base + "7");
    const auto b = test::run_tandem(base + "7");
    const auto c = test::run_tandem(base + "8");
    REQUIRE(a.exit_code == 0);
    CHECK(a.out == b.out);
    CHECK(a.out != c.out);
  }

  TEST_CASE("small and large repetition penalties in range run") {
    const std::string base = "run -m '" + test::data_path("stories260K.gguf").string() + "' -p 'Once upon a time' -n 8 --temp 0 --repeat-penalty ";
    for (const char* ok : {"1e-3", "1", "10"}) {
      CAPTURE(ok);
      const auto r = test::run_tandem(base + ok);
      CHECK(r.exit_code == 0);
      CHECK(r.err.find("generated: 8 tokens") != std::string::npos);
    }
    // A strong penalty changes greedy output: repeated tokens are pushed down.
    CHECK(test::run_tandem(base + "1").out != test::run_tandem(base + "10").out);
  }

  TEST_CASE("bad arguments and bad files give a clear error and exit code") {
    const auto model = test::data_path("stories260K.gguf").string();
    auto r = test::run_tandem("run -m '" + model + "' -n 4");
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("exactly one of -p/--prompt and --chat") != std::string::npos);
    r = test::run_tandem("run -m /nonexistent.gguf -p hi");
    CHECK(r.exit_code != 0);
    r = test::run_tandem("run -m '" + model + "' -p hi --temp -1");
    CHECK(r.exit_code != 0);
    // A repetition penalty of 0 (or below) is refused by the flag check, naming the problem.
    for (const char* bad : {"0", "-0.5", "0.0", "11", "abc"}) {
      CAPTURE(bad);
      r = test::run_tandem("run -m '" + model + "' -p hi -n 2 --temp 0 --repeat-penalty " + bad);
      CHECK(r.exit_code != 0);
      CHECK(r.err.find("repetition penalty must be a number > 0 and <= 10") != std::string::npos);
      CHECK(r.out.empty());
    }
    r = test::run_tandem("run -m '" + test::data_path("vocab/ggml-vocab-llama-spm.gguf").string() + "' -p hi");
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("token_embd.weight") != std::string::npos);
    r = test::run_tandem("run -m '" + model + "' -p 'Once upon a time' -n 500 --ctx-size 16 --temp 0");
    CHECK(r.exit_code == 0);  // stops when the context is full instead of failing
    // 5 prompt + 11 generated tokens fill the 16 positions; the 12th is sampled from the
    // last position's logits and needs no cache slot.
    CHECK(r.err.find("generated: 12 tokens") != std::string::npos);
  }
}

TEST_SUITE("smollm_run") {
  TEST_CASE("SmolLM2 continues a prompt exactly as llama.cpp does") {
    test::require_smollm();
    const auto ref = fixture("smollm2-greedy.json");
    const auto& run = ref["runs"][0];
    const auto r = test::run_tandem("run -m '" + test::smollm_path().string() + "' -p '" + run["prompt"].get<std::string>() + "' -n 32 --temp 0");
    REQUIRE(r.exit_code == 0);
    CHECK(r.out == run["generated_text"].get<std::string>() + "\n");
  }

  TEST_CASE("--chat renders the model's template, answers, and stops at end of turn") {
    test::require_smollm();
    SUBCASE("no system message: the template's default system prompt is not injected") {
      const auto r = test::run_tandem("run -m '" + test::smollm_path().string() +
                                      "' --chat 'What is the capital of France?' -n 32 --temp 0");
      REQUIRE(r.exit_code == 0);
      CHECK(r.out == "The capital of France is Paris.\n");
      CHECK(r.err.find("generated: 7 tokens") != std::string::npos);  // <|im_end|> ended the turn
    }
    SUBCASE("explicit system message") {
      const auto r = test::run_tandem("run -m '" + test::smollm_path().string() +
                                      "' --chat 'What is the capital of France?' --system 'You are a helpful assistant.' -n 64 --temp 0");
      REQUIRE(r.exit_code == 0);
      CHECK(r.out == "The capital of France is Paris.\n");
    }
    SUBCASE("--default-system renders SmolLM2's own system prompt, as llama.cpp's Jinja path does") {
      // smollm2-chat.json is llama.cpp's greedy answer to the Jinja-rendered prompt; its first
      // tokens are well clear of near-ties, so the start of the answer must be the same.
      const auto ref = fixture("smollm2-chat.json");
      const auto r = test::run_tandem("run -m '" + test::smollm_path().string() +
                                      "' --chat 'What is the capital of France?' --default-system -n 6 --temp 0");
      REQUIRE(r.exit_code == 0);
      REQUIRE(r.out.size() > 1);
      CHECK(ref["generated_text"].get<std::string>().rfind(r.out.substr(0, r.out.size() - 1), 0) == 0);
    }
  }
}
