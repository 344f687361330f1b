// bench/gpu_bench without a GPU: the JSON and the tables on fixed figures, the targets, the
// parameter count of scripts/gpu-check's synthetic model, and a clean refusal to measure
// where no device answers. The measuring itself runs in scripts/gpu-check.
#include "bench/gpu_bench.h"

#include <doctest/doctest.h>

#include <regex>
#include <stdexcept>

#include "tests/test_support.h"

using namespace tandem;

namespace {

// Round figures, so each ratio and cell is known exactly.
bench::gpu_bench_figures fixed(const std::string& type) {
  bench::gpu_bench_figures f;
  f.device = "NVIDIA H200";
  f.model = "/models/synth-1b-" + type + ".gguf";
  f.type = type == "q4_k" ? "Q4_K" : "Q8_0";
  f.model_bytes = uint64_t{600} << 20;
  f.decode_bytes_per_token = 500'000'000;
  f.segments = 23;
  f.prompt = 512;
  f.gen = 64;
  f.reps = 3;
  f.pinned_h2d_gb_s = 48;
  f.memcpy_ceiling_gb_s = 50;
  f.swap_in_s = 0.0125;
  f.swap_in_gb_s = 45;
  f.first_token_ms_pipelined = 30;
  f.first_token_ms_sequential = 40;
  f.prefill_tok_s = 20000;
  f.decode_tok_s = 4800;
  f.decode_gb_s = 2400;
  f.d2d_gb_s = 4000;
  f.decode_cuda_graphs = true;
  return f;
}

const char* const k_fields[] = {"device",
                                "model",
                                "type",
                                "model_bytes",
                                "decode_bytes_per_token",
                                "segments",
                                "prompt",
                                "gen",
                                "reps",
                                "pinned_h2d_gb_s",
                                "memcpy_ceiling_gb_s",
                                "swap_in_s",
                                "swap_in_gb_s",
                                "first_token_ms_pipelined",
                                "first_token_ms_sequential",
                                "prefill_tok_s",
                                "decode_tok_s",
                                "decode_gb_s",
                                "d2d_gb_s",
                                "decode_cuda_graphs"};
const char* const k_ratios[] = {"swap_in_vs_ceiling", "decode_vs_roofline", "pipelined_vs_sequential"};

}  // namespace

TEST_SUITE("bench_gpu") {
  TEST_CASE("to_json has every field and the ratios, and reads back to the same figures") {
    const auto f = fixed("q4_k");
    const auto j = bench::to_json(f);
    CHECK(j.size() == std::size(k_fields) + std::size(k_ratios));
    for (const char* k : k_fields) {
      CAPTURE(k);
      CHECK(j.contains(k));
    }
    CHECK(j["device"] == "NVIDIA H200");
    CHECK(j["model_bytes"] == uint64_t{600} << 20);
    CHECK(j["swap_in_gb_s"] == 45.0);
    CHECK(j["swap_in_vs_ceiling"].get<double>() == doctest::Approx(0.9));
    CHECK(j["decode_vs_roofline"].get<double>() == doctest::Approx(0.6));
    CHECK(j["pipelined_vs_sequential"].get<double>() == doctest::Approx(0.75));
    CHECK(bench::gpu_figures_from_json(j) == f);
    CHECK(bench::gpu_figures_from_json(nlohmann::json::parse(j.dump())) == f);
  }

  TEST_CASE("reading figures back names what is missing or malformed") {
    auto j = bench::to_json(fixed("q8_0"));
    SUBCASE("missing") {
      j.erase("d2d_gb_s");
      CHECK_THROWS_WITH_AS(bench::gpu_figures_from_json(j), doctest::Contains("'d2d_gb_s'"), std::invalid_argument);
    }
    SUBCASE("a number as a string") {
      j["decode_tok_s"] = "fast";
      CHECK_THROWS_WITH_AS(bench::gpu_figures_from_json(j), doctest::Contains("'decode_tok_s'"), std::invalid_argument);
    }
    SUBCASE("negative bytes") {
      j["model_bytes"] = -1;
      CHECK_THROWS_WITH_AS(bench::gpu_figures_from_json(j), doctest::Contains("'model_bytes'"), std::invalid_argument);
    }
    SUBCASE("figures written before decode_cuda_graphs read it as false") {
      j.erase("decode_cuda_graphs");
      CHECK_FALSE(bench::gpu_figures_from_json(j).decode_cuda_graphs);
    }
    SUBCASE("decode_cuda_graphs not a boolean") {
      j["decode_cuda_graphs"] = 1;
      CHECK_THROWS_WITH_AS(bench::gpu_figures_from_json(j), doctest::Contains("'decode_cuda_graphs'"), std::invalid_argument);
    }
    SUBCASE("not an object") { CHECK_THROWS_AS(bench::gpu_figures_from_json(nlohmann::json::array()), std::invalid_argument); }
  }

  TEST_CASE("ratios divide the medians and are 0 over a zero divisor") {
    bench::gpu_bench_figures f;
    CHECK(f.swap_in_vs_ceiling() == 0);
    CHECK(f.decode_vs_roofline() == 0);
    CHECK(f.pipelined_vs_sequential() == 0);
    f.swap_in_gb_s = 3;
    f.memcpy_ceiling_gb_s = 4;
    CHECK(f.swap_in_vs_ceiling() == doctest::Approx(0.75));
  }

  TEST_CASE("targets: swap-in for every type, decode for Q4_K only") {
    auto q4 = fixed("q4_k"), q8 = fixed("q8_0");
    CHECK(bench::gpu_targets_missed(q4).empty());  // 0.90 and 0.60: both met, the second exactly
    q4.decode_gb_s = 2399;
    CHECK(bench::gpu_targets_missed(q4) == std::vector<std::string>{"decode"});
    q4.swap_in_gb_s = 42;  // 0.84
    CHECK(bench::gpu_targets_missed(q4) == std::vector<std::string>{"swap-in", "decode"});
    q8.decode_gb_s = 100;  // far below the roofline, but Q8_0 has no decode target
    CHECK(bench::gpu_targets_missed(q8).empty());
  }

  TEST_CASE("one table of two runs: a column each, every figure, the targets") {
    auto q4 = fixed("q4_k"), q8 = fixed("q8_0");
    q8.decode_gb_s = 3000;
    q8.decode_cuda_graphs = false;
    q8.swap_in_gb_s = 40;  // 0.80: misses the swap-in target
    const std::vector<bench::gpu_bench_figures> runs{q4, q8};
    const auto t = bench::format_gpu_table(runs);
    CAPTURE(t);
    const auto first_line = t.substr(0, t.find('\n'));
    CHECK(first_line.find("synth-1b-q4_k") != std::string::npos);
    CHECK(first_line.find("synth-1b-q8_0") != std::string::npos);
    CHECK(first_line.find(".gguf") == std::string::npos);
    for (const char* s : {"NVIDIA H200",
                          "Q4_K",
                          "Q8_0",
                          "600.0",
                          "512 / 64",
                          "pinned H2D",
                          "48.00",
                          "memcpy ceiling",
                          "50.00",
                          "12.50",
                          "45.00",
                          "0.90",
                          "0.80",
                          "first token, pipelined",
                          "30.00",
                          "40.00",
                          "0.75",
                          "20000.0",
                          "4800.0",
                          "2400.0",
                          "3000.0",
                          "4000.0",
                          "0.60",
                          "0.75",
                          "swap-in / ceiling (>= 0.85)",
                          "decode / roofline (Q4_K >= 0.60)",
                          "missed: swap-in"}) {
      CAPTURE(s);
      CHECK(t.find(s) != std::string::npos);
    }
    const auto graphs = t.substr(t.find("\ndecode from CUDA graphs") + 1);
    CHECK(graphs.substr(0, graphs.find('\n')).find("yes") < graphs.substr(0, graphs.find('\n')).find("no"));
    // The targets row: the Q4_K run meets both, the Q8_0 run misses swap-in.
    const auto targets = t.substr(t.find("\ntargets") + 1);
    CHECK(targets.find("met") < targets.find("missed: swap-in"));
    // Cells are right-aligned in columns as wide as their widest cell: every line ends at the
    // same column.
    size_t width = 0;
    for (size_t at = 0, end; (end = t.find('\n', at)) != std::string::npos; at = end + 1) {
      if (width == 0) width = end - at;
      CHECK(end - at == width);
    }
  }

  TEST_CASE("a single run's table is the one-column table") {
    const auto f = fixed("q4_k");
    CHECK(bench::format_gpu_table(f) == bench::format_gpu_table(std::span<const bench::gpu_bench_figures>(&f, 1)));
    CHECK(bench::format_gpu_table(std::span<const bench::gpu_bench_figures>{}) == "no runs\n");
  }

  TEST_CASE("parameter count of a llama shape") {
    // tandem synth reported 221.26M parameters (221259776) for this shape.
    CHECK(bench::llama_parameters({.dim = 2048, .layers = 2, .heads = 32, .kv_heads = 8, .ffn = 5632, .vocab = 32000}) == 221'259'776);
    // Tied: one table fewer.
    CHECK(bench::llama_parameters({.dim = 64, .layers = 1, .heads = 4, .kv_heads = 0, .ffn = 128, .vocab = 100, .tied = true}) ==
          100 * 64 + 64 + (2 * 64 * 64 + 2 * 64 * 64 + 3 * 64 * 128 + 2 * 64));
    CHECK_THROWS_AS(bench::llama_parameters({.dim = 100, .layers = 1, .heads = 3, .ffn = 1, .vocab = 1}), std::invalid_argument);
  }

  TEST_CASE("scripts/gpu-check synthesizes a model of about 1B parameters") {
    const auto script = test::read_file(test::data_path("../../scripts/gpu-check"));
    auto flag = [&](const char* name) -> int64_t {
      std::smatch m;
      const std::regex re(std::string("--") + name + " ([0-9]+)");
      REQUIRE_MESSAGE(std::regex_search(script, m, re), "scripts/gpu-check passes no --" << name);
      return std::stoll(m[1].str());
    };
    bench::llama_shape s{.dim = flag("dim"),
                         .layers = flag("layers"),
                         .heads = flag("heads"),
                         .kv_heads = flag("kv-heads"),
                         .ffn = flag("ffn"),
                         .vocab = 32000};  // ggml-vocab-llama-spm.gguf
    CHECK(script.find("ggml-vocab-llama-spm.gguf") != std::string::npos);
    const auto n = bench::llama_parameters(s);
    MESSAGE("scripts/gpu-check's model: " << n << " parameters");
    CHECK(n > 900'000'000);
    CHECK(n < 1'200'000'000);
  }

  TEST_CASE("without a device, run_gpu_bench refuses with the reason") {
    bench::gpu_bench_options o;
    o.model_path = test::data_path("stories260K.gguf").string();
    o.reps = 0;
    CHECK_THROWS_AS(bench::run_gpu_bench(o), std::invalid_argument);  // settings first, device or not
    o.reps = 1;
    const auto why = bench::gpu_bench_unavailable();
    if (why.empty()) {
      MESSAGE("skipped: a CUDA device answers here (scripts/gpu-check measures on it)");
      return;
    }
#if !defined(TANDEM_HAVE_CUDA)
    CHECK(why.find("built without CUDA") != std::string::npos);
#endif
    CHECK_THROWS_WITH_AS(bench::run_gpu_bench(o), doctest::Contains(("bench gpu: " + why).c_str()), std::runtime_error);
  }
}
