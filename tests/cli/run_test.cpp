// `tandem run` end to end: the real binary on the committed test model and on SmolLM2.
#include <doctest/doctest.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "tests/test_support.h"

using namespace tandem;

namespace {
nlohmann::json fixture(const std::string& name) { return nlohmann::json::parse(test::read_file(test::data_path("reference/" + name))); }
}  // namespace

TEST_SUITE("run") {
  TEST_CASE("--vram: the whole model, part of it, or about one layer on the device give the same text") {
    // The test model (1.1 MiB of F32 weights, segments of up to 178 KiB, 64 KiB blocks) and a
    // synthetic Q8_0 one (embedding table and head in pieces).
    test::scratch_dir dir;
    const auto synth = (dir / "s.gguf").string();
    REQUIRE(test::run_tandem("synth --arch llama --dim 64 --layers 3 --heads 4 --kv-heads 2 --ffn 64 --type q8_0 --seed 5 --vocab-from '" +
                             test::data_path("stories260K.gguf").string() + "' '" + synth + "'")
                .exit_code == 0);
    const std::string stories = test::data_path("stories260K.gguf").string();
    for (const std::string& path : {stories, synth}) {
      CAPTURE(path);
      // Budgets per model: all of it; KV, scratch, three slots and some segments; KV, scratch
      // and one slot.
      const std::vector<std::string> budgets =
          path == stories ? std::vector<std::string>{"64MiB", "1MiB", "384KiB"} : std::vector<std::string>{"64MiB", "384KiB", "192KiB"};
      const std::string base = "-v run -m '" + path + "' -p 'Once upon a time' -n 24 --temp 0";
      const auto want = test::run_tandem(base);
      REQUIRE(want.exit_code == 0);
      for (const std::string& budget : budgets) {
        CAPTURE(budget);
        for (const std::string host : {"", " --host-ram 0", " --link-gbps 1"}) {
          CAPTURE(host);
          const auto r = test::run_tandem(base + " --vram " + budget + host);
          REQUIRE(r.exit_code == 0);
          CHECK(r.out == want.out);
          CHECK(r.err.find("segments on the device") != std::string::npos);
          if (budget == "64MiB")
            CHECK(r.err.find("streamed") == std::string::npos);
          else
            CHECK(r.err.find("the rest streamed through") != std::string::npos);
          if (budget == budgets.back()) {
            CHECK(r.err.find(": 0 of ") != std::string::npos);
            CHECK(r.err.find("streamed through 1 stream slot\n") != std::string::npos);
          }
        }
      }
    }
  }

  TEST_CASE("--vram too small for the weights with --no-stream, or for the KV cache, is a clear error") {
    const std::string base = "run -m '" + test::data_path("stories260K.gguf").string() + "' -p 'Once upon a time' -n 4 --temp 0";
    auto r = test::run_tandem(base + " --vram 512KiB --no-stream");
    CHECK(r.exit_code != 0);
    CHECK(r.err.find("need 1.1 MiB of device memory") != std::string::npos);
    CHECK(r.err.find("device budget of 512.0 KiB") != std::string::npos);
    r = test::run_tandem(base + " --vram 32KiB");
    CHECK(r.exit_code != 0);
    CHECK(r.err.find("KV cache") != std::string::npos);
    r = test::run_tandem(base + " --vram lots");
    CHECK(r.exit_code != 0);
    CHECK(r.err.find("expected a size") != std::string::npos);
    r = test::run_tandem(base + " --link-gbps 2");
    CHECK(r.exit_code != 0);
    CHECK(r.err.find("need --vram") != std::string::npos);
  }

  TEST_CASE("--gpu without a CUDA device (or build) is one clear error, not a crash; --gpu with a device writes the CPU's text") {
    const std::string base = "run -m '" + test::data_path("stories260K.gguf").string() + "' -p 'Once upon a time' -n 24 --temp 0";
    auto r = test::run_tandem(base + " --gpu --vram 4MiB");
    CHECK(r.exit_code != 0);
    CHECK(r.err.find("cannot be combined") != std::string::npos);
    r = test::run_tandem(base + " --gpu");
    if (r.exit_code != 0) {
      // No device here (or a build without CUDA): the reason, named after the flag.
      CHECK(r.err.find("--gpu: ") != std::string::npos);
      CHECK(r.out.empty());
      return;
    }
    const auto cpu = test::run_tandem(base);
    REQUIRE(cpu.exit_code == 0);
    CHECK(r.out == cpu.out);
    CHECK(r.err.find("cuda:0") != std::string::npos);
  }

  TEST_CASE("stories260K greedy writes exactly llama.cpp's text to stdout and timings to stderr") {
    const auto ref = fixture("stories260K-greedy.json");
    const auto r = test::run_tandem("run -m '" + test::data_path("stories260K.gguf").string() + "' -p 'Once upon a time' -n 48 --temp 0");
    REQUIRE(r.exit_code == 0);
    CHECK(r.out == ref["generated_text"].get<std::string>() + "\n");
    CHECK(r.err.find("prompt: 5 tokens") != std::string::npos);
    CHECK(r.err.find("generated: 48 tokens") != std::string::npos);
  }

  TEST_CASE("--draft-ngram and --draft: llama.cpp's greedy text unchanged, the speculation reported; on a simulated device too") {
    const auto ref = fixture("stories260K-greedy.json");
    const std::string want = ref["generated_text"].get<std::string>() + "\n";
    const std::string base = "run -m '" + test::data_path("stories260K.gguf").string() + "' -p 'Once upon a time' -n 48 --temp 0";
    const std::string draft = " --draft '" + test::data_path("stories260K-q8_0.gguf").string() + "'";
    for (const std::string& flags : {std::string(" --draft-ngram"), std::string(" --draft-ngram --draft-max 3"), draft, draft + " --vram 64MiB"}) {
      CAPTURE(flags);
      const auto r = test::run_tandem(base + flags);
      REQUIRE(r.exit_code == 0);
      CHECK(r.out == want);
      CHECK(r.err.find("generated: 48 tokens") != std::string::npos);
      CHECK(r.err.find("proposed tokens accepted") != std::string::npos);
    }
    // The same weights in Q8_0 guess the F32 model's tokens nearly always.
    const auto r = test::run_tandem("-v " + base + draft);
    CHECK(r.err.find("draft " + test::data_path("stories260K-q8_0.gguf").string()) != std::string::npos);
    CHECK(r.err.find(" of 0 proposed") == std::string::npos);
  }

  TEST_CASE("--draft-max without a proposer, and --draft with --draft-ngram, are refused") {
    const std::string base = "run -m '" + test::data_path("stories260K.gguf").string() + "' -p hi -n 2 --temp 0";
    auto r = test::run_tandem(base + " --draft-max 4");
    CHECK(r.exit_code != 0);
    CHECK(r.err.find("--draft-max needs --draft FILE or --draft-ngram") != std::string::npos);
    r = test::run_tandem(base + " --draft-ngram --draft '" + test::data_path("stories260K.gguf").string() + "'");
    CHECK(r.exit_code != 0);
    CHECK(r.err.find("excludes") != std::string::npos);
    r = test::run_tandem(base + " --draft-ngram --draft-max 33");
    CHECK(r.exit_code != 0);
    r = test::run_tandem(base + " --draft /nonexistent.gguf");
    CHECK(r.exit_code != 0);
  }

  TEST_CASE("a seed makes sampling repeatable; different seeds differ") {
    const std::string base =
        "run -m '" + test::data_path("stories260K.gguf").string() + "' -p 'Once upon a time' -n 40 --temp 1.2 --top-k 0 --top-p 1 --min-p 0 --seed ";
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

  TEST_CASE("--grammar and --json-schema constrain the output; a bad one is an error naming the file") {
    const std::string model = test::data_path("stories260K.gguf").string();
    test::scratch_dir dir;
    {
      std::ofstream(dir / "pet.gbnf") << "root ::= \" Lily\" (\" and Tom\")? \".\"\n";
      std::ofstream(dir / "n.json") << R"({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]})";
      std::ofstream(dir / "bad.json") << R"({"type": "string", "pattern": "x"})";
    }
    auto r = test::run_tandem("run -m '" + model + "' -p 'Once upon a time, there was a girl named' --seed 3 -n 30 --grammar '" +
                              (dir / "pet.gbnf").string() + "'");
    REQUIRE(r.exit_code == 0);
    CHECK((r.out == " Lily.\n" || r.out == " Lily and Tom.\n"));
    r = test::run_tandem("run -m '" + model + "' -p 'Once' --seed 3 -n 60 --json-schema '" + (dir / "n.json").string() + "'");
    REQUIRE(r.exit_code == 0);
    if (r.err.find("generated: 60 tokens") == std::string::npos) CHECK(nlohmann::json::parse(r.out, nullptr, false)["n"].is_number_integer());
    r = test::run_tandem("run -m '" + model + "' -p 'Once' --json-schema '" + (dir / "bad.json").string() + "'");
    CHECK(r.exit_code != 0);
    CHECK(r.err.find("bad.json: JSON schema: keyword 'pattern' is not supported") != std::string::npos);
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

  TEST_CASE("SmolLM2 with n-gram lookup, and with stories260K drafting through text (another vocabulary): llama.cpp's text exactly") {
    test::require_smollm();
    const auto ref = fixture("smollm2-greedy.json");
    const auto& run = ref["runs"][0];
    const std::string base = "run -m '" + test::smollm_path().string() + "' -p '" + run["prompt"].get<std::string>() + "' -n 32 --temp 0";
    const std::string stories = " --draft '" + test::data_path("stories260K.gguf").string() + "'";
    for (const std::string& flags : {std::string(" --draft-ngram"), stories, stories + " --draft-max 3"}) {
      CAPTURE(flags);
      const auto r = test::run_tandem(base + flags);
      REQUIRE(r.exit_code == 0);
      CHECK(r.out == run["generated_text"].get<std::string>() + "\n");
      CHECK(r.err.find("proposed tokens accepted") != std::string::npos);
    }
  }

  TEST_CASE("--chat renders the model's template, answers, and stops at end of turn") {
    test::require_smollm();
    SUBCASE("no system message: the template's default system prompt is not injected") {
      const auto r = test::run_tandem("run -m '" + test::smollm_path().string() + "' --chat 'What is the capital of France?' -n 32 --temp 0");
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
      const auto r =
          test::run_tandem("run -m '" + test::smollm_path().string() + "' --chat 'What is the capital of France?' --default-system -n 6 --temp 0");
      REQUIRE(r.exit_code == 0);
      REQUIRE(r.out.size() > 1);
      CHECK(ref["generated_text"].get<std::string>().rfind(r.out.substr(0, r.out.size() - 1), 0) == 0);
    }
  }
}
