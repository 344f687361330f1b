// `tandem bench gpu` through the real executable, without a GPU: the combined table
// scripts/gpu-check prints from saved runs, and the refusal where no device answers.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <fstream>

#include "bench/gpu_bench.h"
#include "tests/test_support.h"

using namespace tandem;

namespace {

nlohmann::json run_json(const std::string& model, const std::string& type, double swap_in_gb_s) {
  bench::gpu_bench_figures f;
  f.device = "NVIDIA H200";
  f.model = model;
  f.type = type;
  f.model_bytes = 1 << 30;
  f.prompt = 512;
  f.gen = 64;
  f.reps = 3;
  f.memcpy_ceiling_gb_s = 50;
  f.swap_in_gb_s = swap_in_gb_s;
  f.decode_gb_s = 2600;
  f.d2d_gb_s = 4000;
  return bench::to_json(f);
}

void write(const std::filesystem::path& p, const std::string& text) { std::ofstream(p) << text; }

}  // namespace

TEST_SUITE("bench_gpu") {
  TEST_CASE("--from-json prints saved runs side by side, no device needed") {
    test::scratch_dir dir;
    write(dir / "a.json", run_json("build-gpu/models/synth-1b-q4_k.gguf", "Q4_K", 46).dump() + "\n");
    write(dir / "b.json", run_json("build-gpu/models/synth-1b-q8_0.gguf", "Q8_0", 40).dump() + "\n");
    const auto args = "bench gpu --from-json '" + (dir / "a.json").string() + "' '" + (dir / "b.json").string() + "'";
    const auto r = test::run_tandem(args);
    REQUIRE(r.exit_code == 0);
    CAPTURE(r.out);
    const auto head = r.out.substr(0, r.out.find('\n'));
    CHECK(head.find("synth-1b-q4_k") < head.find("synth-1b-q8_0"));
    for (const char* s : {"swap-in / ceiling", "0.92", "0.80", "decode / roofline", "0.65", "missed: swap-in"}) {
      CAPTURE(s);
      CHECK(r.out.find(s) != std::string::npos);
    }
    const auto j = test::run_tandem(args + " --json");
    REQUIRE(j.exit_code == 0);
    const auto arr = nlohmann::json::parse(j.out);
    REQUIRE(arr.is_array());
    CHECK(arr.size() == 2);
    CHECK(arr[1]["type"] == "Q8_0");
  }

  TEST_CASE("--from-json names a file that is not a run") {
    test::scratch_dir dir;
    write(dir / "bad.json", "{\"device\": \"x\"}\n");
    write(dir / "junk.json", "not json\n");
    auto r = test::run_tandem("bench gpu --from-json '" + (dir / "bad.json").string() + "'");
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("bad.json") != std::string::npos);
    CHECK(r.err.find("'model'") != std::string::npos);
    r = test::run_tandem("bench gpu --from-json '" + (dir / "junk.json").string() + "'");
    CHECK(r.exit_code == 1);
    CHECK(r.err.find("is not JSON") != std::string::npos);
  }

  TEST_CASE("without a device: one error line and exit status 2") {
    if (bench::gpu_bench_unavailable().empty()) {
      MESSAGE("skipped: a CUDA device answers here");
      return;
    }
    const auto r = test::run_tandem("bench gpu -m '" + test::data_path("stories260K.gguf").string() + "' --json");
    CHECK(r.exit_code == 2);
    CHECK(r.out.empty());
    CHECK(r.err.find("bench gpu needs a CUDA device") != std::string::npos);
    CHECK(r.err.find('\n') == r.err.size() - 1);  // exactly one line
    const auto none = test::run_tandem("bench gpu");
    CHECK(none.exit_code == 1);
    CHECK(none.err.find("-m/--model") != std::string::npos);
  }
}
