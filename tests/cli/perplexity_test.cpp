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
  }
}
