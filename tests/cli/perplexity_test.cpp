// `tandem perplexity`: the table line and --json of a text file's perplexity.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <string>

#include "tests/test_support.h"

using namespace tandem;

TEST_SUITE("cmd_perplexity") {
  TEST_CASE("a text file's perplexity, as a line and as JSON; bad input is a clear error") {
    test::scratch_dir dir;
    std::ofstream(dir / "story.txt") << "Once upon a time, there was a little girl named Lily. She loved to play outside in the park. "
                                        "One day, she saw a big tree with a swing. She ran to the swing and sat on it. Lily was very happy.";
    const std::string model = test::data_path("stories260K.gguf").string();
    const std::string text = (dir / "story.txt").string();
    const auto line = test::run_tandem("perplexity -m '" + model + "' -f '" + text + "' --ctx 32 -t 1");
    CHECK(line.exit_code == 0);
    CHECK(line.out.find("PPL = ") != std::string::npos);
    const auto js = test::run_tandem("perplexity -m '" + model + "' -f '" + text + "' --ctx 32 --kv-type f32 -t 1 --json");
    REQUIRE(js.exit_code == 0);
    const auto j = nlohmann::json::parse(js.out);
    CHECK(j["kv_type"] == "f32");
    CHECK(j["chunks"].get<int>() >= 2);
    CHECK(j["scored"].get<int>() == j["chunks"].get<int>() * 15);
    CHECK(j["ppl"].get<double>() > 1.0);
    CHECK(j["running"].size() == j["chunks"].get<size_t>());
    const auto short_text = test::run_tandem("perplexity -m '" + model + "' -f '" + text + "' --ctx 100000 -t 1");
    CHECK(short_text.exit_code == 1);
    CHECK(short_text.err.find("fewer than one chunk") != std::string::npos);
    CHECK(test::run_tandem("perplexity -m '" + model + "' -f '" + text + "' --kv-type q3").exit_code != 0);
    // stories260K's 8-wide heads hold no 32-value block.
    const auto q4 = test::run_tandem("perplexity -m '" + model + "' -f '" + text + "' --ctx 32 --kv-type q4_0 -t 1");
    CHECK(q4.exit_code == 1);
    CHECK(q4.err.find("a q4_0 KV cache needs heads of a multiple of 32 elements (the model's heads are 8 wide)") != std::string::npos);
  }
}

TEST_SUITE("smollm_perplexity") {
  TEST_CASE("each KV cache type on SmolLM2: rotation on for q4_0 unless turned off, q8_0 near f16") {
    test::require_smollm();
    test::scratch_dir dir;
    std::ofstream(dir / "text.txt") << "The quick brown fox jumps over the lazy dog. A journey of a thousand miles begins with a single step. "
                                       "All that glitters is not gold. Actions speak louder than words. Knowledge is power, and time is money. "
                                       "Where there is a will, there is a way. Practice makes perfect, and patience is a virtue.";
    const auto ppl = [&](const std::string& flags) {
      const auto r = test::run_tandem("perplexity -m '" + test::smollm_path().string() + "' -f '" + (dir / "text.txt").string() +
                                      "' --ctx 32 -t 2 --json " + flags);
      REQUIRE(r.exit_code == 0);
      return nlohmann::json::parse(r.out);
    };
    const auto f16 = ppl(""), q8 = ppl("--kv-type q8_0"), q4 = ppl("--kv-type q4_0"), q4_plain = ppl("--kv-type q4_0 --kv-rotate off");
    CHECK(f16["kv_type"] == "f16");
    CHECK(f16["kv_rotate"] == false);
    CHECK(q8["kv_rotate"] == false);
    CHECK(q4["kv_type"] == "q4_0");
    CHECK(q4["kv_rotate"] == true);
    CHECK(q4_plain["kv_rotate"] == false);
    CHECK(q8["scored"] == f16["scored"]);
    CHECK(std::abs(q8["ppl"].get<double>() / f16["ppl"].get<double>() - 1) < 0.05);
    CHECK(q4["ppl"].get<double>() != q4_plain["ppl"].get<double>());
  }
}
