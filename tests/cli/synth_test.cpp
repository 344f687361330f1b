// `tandem synth` through the real executable.
#include <doctest/doctest.h>

#include "tests/test_support.h"

using namespace tandem;

namespace {

std::string synth_args(const std::string& extra, const std::string& out) {
  return "synth --arch llama --dim 64 --layers 2 --heads 4 --kv-heads 2 --ffn 128 --vocab-from '" + test::data_path("stories260K.gguf").string() +
         "' " + extra + " '" + out + "'";
}

}  // namespace

TEST_SUITE("synth") {
  TEST_CASE("writes a model that inspect reads, with a summary on stderr") {
    test::scratch_dir dir;
    const auto out = (dir / "m.gguf").string();
    const auto r = test::run_tandem(synth_args("--type q8_0 --seed 3", out));
    REQUIRE(r.exit_code == 0);
    CHECK(r.out.empty());
    CHECK(r.err.find("synth: wrote " + out) != std::string::npos);
    CHECK(r.err.find("parameters") != std::string::npos);
    CHECK(r.err.find("MiB") != std::string::npos);
    CHECK(r.err.find("note") == std::string::npos);

    const auto i = test::run_tandem("inspect '" + out + "'");
    REQUIRE(i.exit_code == 0);
    CHECK(i.out.find("general.architecture") != std::string::npos);
    CHECK(i.out.find("\"llama\"") != std::string::npos);
    CHECK(i.out.find("llama.attention.head_count_kv") != std::string::npos);
    CHECK(i.out.find("[string x 512] \"<unk>\"") != std::string::npos);
    // 1 + 2 layers x 9 + output_norm + output
    CHECK(i.out.find("tensors: 21") != std::string::npos);
    CHECK(i.out.find("blk.1.ffn_down.weight") != std::string::npos);
  }

  TEST_CASE("the same seed writes the same bytes") {
    test::scratch_dir dir;
    REQUIRE(test::run_tandem(synth_args("--type f16 --seed 9 --tied", (dir / "a.gguf").string())).exit_code == 0);
    REQUIRE(test::run_tandem(synth_args("--type f16 --seed 9 --tied", (dir / "b.gguf").string())).exit_code == 0);
    CHECK(test::read_file(dir / "a.gguf") == test::read_file(dir / "b.gguf"));
    const auto i = test::run_tandem("inspect '" + (dir / "a.gguf").string() + "'");
    CHECK(i.out.find("\n  output.weight ") == std::string::npos);  // --tied
    CHECK(i.out.find("\n  output_norm.weight ") != std::string::npos);
  }

  TEST_CASE("a fallback is noted on stderr") {
    test::scratch_dir dir;
    const auto r = test::run_tandem(synth_args("--type q4_k --seed 1", (dir / "m.gguf").string()));
    REQUIRE(r.exit_code == 0);
    CHECK(r.err.find("synth: note: token_embd.weight: ne[0] = 64") != std::string::npos);
    CHECK(r.err.find("written as Q8_0") != std::string::npos);
  }

  TEST_CASE("bad arguments fail with a message") {
    test::scratch_dir dir;
    const auto out = (dir / "m.gguf").string();
    auto r = test::run_tandem(synth_args("--type nope --seed 1", out));
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("--type 'nope'") != std::string::npos);
    r = test::run_tandem(synth_args("--type q2_k --seed 1", out));
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("--type Q2_K") != std::string::npos);
    r = test::run_tandem(synth_args("--type f16 --seed 1 --head-dim 7", out));
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("--head-dim 7") != std::string::npos);
    r = test::run_tandem("synth --arch gpt2 --dim 64 --layers 1 --heads 1 --ffn 64 --vocab-from '" + test::data_path("stories260K.gguf").string() +
                         "' --type f16 --seed 1 '" + out + "'");
    CHECK(r.exit_code != 0);
    CHECK(r.err.find("--arch") != std::string::npos);
    CHECK_FALSE(std::filesystem::exists(out));
  }
}
