// `tandem bench` through the real executable on the committed tiny model.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "tests/test_support.h"
#include "kernels/cpu/isa.h"

using namespace tandem;

namespace {
std::string bench_cmd(const std::string& extra) {
  // A 16 MiB read buffer keeps the test light; the ceiling itself is not what is checked.
  return "bench -m '" + test::data_path("stories260K.gguf").string() + "' -t 2 --read-mib 16 " + extra;
}
}  // namespace

TEST_SUITE("bench") {
  TEST_CASE("--json prints exactly one object with the medians as positive numbers") {
    const auto r = test::run_tandem(bench_cmd("--prompt 16 --gen 4 --batch 3 --reps 2 --json"));
    REQUIRE(r.exit_code == 0);
    const auto j = nlohmann::json::parse(r.out);  // throws on anything but one JSON value
    REQUIRE(j.is_object());
    for (const char* key : {"prefill_tok_s", "decode_tok_s", "batched_decode_tok_s", "decode_gb_s", "read_ceiling_gb_s", "dot_ceiling_gmac_s",
                            "decode_bytes_per_token", "batched_vs_single", "decode_vs_ceiling", "decode_as_batched_tok_s", "batched_vs_decode"}) {
      CAPTURE(key);
      REQUIRE(j.contains(key));
      CHECK(j[key].is_number());
      CHECK(j[key].get<double>() > 0);
    }
    CHECK(j["batch"] == 3);
    CHECK(j["prompt"] == 16);
    CHECK(j["gen"] == 4);
    CHECK(j["reps"] == 2);
    CHECK(j["depth"] == 0);
    CHECK(j["threads"] == 2);
    CHECK(j["type"] == "F32");
    CHECK(j["decode_tok_s_samples"].size() == 2);
    CHECK(j["read_buffer_bytes"] == 16 << 20);
    // Every phase as the server computes it unless asked otherwise.
    CHECK(j["prompt_attention"] == "fast");
    CHECK(j["decode_attention"] == "fast");
    CHECK(j["batched_attention"] == "fast");
    // F32 weights: no int8 products, so no compute ceiling in rows per second.
    CHECK(j["int8_macs_per_token"] == 0);
    CHECK(j["compute_ceiling_tok_s"] == 0);
    CHECK(j["batched_vs_compute_ceiling"] == 0);
    // Medians lie within their spreads.
    for (const char* key : {"prefill_tok_s", "decode_tok_s", "batched_decode_tok_s"}) {
      CAPTURE(key);
      CHECK(j[std::string(key) + "_min"].get<double>() <= j[key].get<double>());
      CHECK(j[key].get<double>() <= j[std::string(key) + "_max"].get<double>());
    }
    // Each decode repetition over the ceiling pass timed right after it (the first passes),
    // then the median of those ratios (two here: their mean).
    const auto& dec = j["decode_gb_s_samples"];
    const auto& ceil = j["read_ceiling_gb_s_samples"];
    const auto& ratios = j["decode_vs_ceiling_samples"];
    REQUIRE(ratios.size() == 2);
    CHECK(ceil.size() == 3);  // at least 3 passes: one per decode repetition, one more
    for (size_t i = 0; i < ratios.size(); ++i) {
      CAPTURE(i);
      CHECK(ratios[i].get<double>() == doctest::Approx(dec[i].get<double>() / ceil[i].get<double>()));
    }
    CHECK(j["decode_vs_ceiling"].get<double>() == doctest::Approx((ratios[0].get<double>() + ratios[1].get<double>()) / 2));
    // Batches against one sequence computed alike, and against decode_tok_s.
    CHECK(j["batched_vs_single"].get<double>() ==
          doctest::Approx(j["batched_decode_tok_s"].get<double>() / j["decode_as_batched_tok_s"].get<double>()));
    CHECK(j["batched_vs_decode"].get<double>() == doctest::Approx(j["batched_decode_tok_s"].get<double>() / j["decode_tok_s"].get<double>()));
    CHECK(j["decode_as_batched_tok_s_samples"].size() == 2);
  }

  TEST_CASE("--depth: prefill and decode after that many tokens, in the JSON and the table") {
    const auto j = nlohmann::json::parse(test::run_tandem(bench_cmd("--prompt 8 --gen 2 --batch 2 --reps 1 --depth 24 --json")).out);
    CHECK(j["depth"] == 24);
    CHECK(j["decode_tok_s"].get<double>() > 0);
    const auto table = test::run_tandem(bench_cmd("--prompt 8 --gen 2 --batch 2 --reps 1 --depth 24"));
    REQUIRE(table.exit_code == 0);
    CHECK(table.out.find("8 tokens @ 24") != std::string::npos);
    CHECK(table.out.find("2 tokens @ 24") != std::string::npos);
    // The context must hold depth + max(prompt, gen) positions.
    const auto bad = test::run_tandem(bench_cmd("--prompt 8 --gen 2 --reps 1 --depth 16777215"));
    CHECK(bad.exit_code != 0);
    CHECK(bad.err.find("depth") != std::string::npos);
  }

  TEST_CASE("--exact-prompt, --exact-decode and --exact-batched each switch their phase to llama.cpp's arithmetic") {
    for (const char* flag : {"--exact-prompt", "--exact-decode", "--exact-batched"}) {
      CAPTURE(flag);
      const auto r = test::run_tandem(bench_cmd(std::string("--prompt 8 --gen 2 --batch 2 --reps 1 --json ") + flag));
      REQUIRE(r.exit_code == 0);
      const auto j = nlohmann::json::parse(r.out);
      CHECK(j["prompt_attention"] == (std::string(flag) == "--exact-prompt" ? "exact" : "fast"));
      CHECK(j["decode_attention"] == (std::string(flag) == "--exact-decode" ? "exact" : "fast"));
      CHECK(j["batched_attention"] == (std::string(flag) == "--exact-batched" ? "exact" : "fast"));
      CHECK(j["batched_decode_tok_s"].get<double>() > 0);
    }
    const auto table = test::run_tandem(bench_cmd("--prompt 8 --gen 2 --batch 2 --reps 1 --exact-prompt --exact-decode"));
    REQUIRE(table.exit_code == 0);
    CHECK(table.out.find("llama.cpp's arithmetic, as `tandem run`") != std::string::npos);
    // --fast-prompt, the default now, is still accepted (commands recorded in docs/ use it).
    const auto old = test::run_tandem(bench_cmd("--prompt 8 --gen 2 --batch 2 --reps 1 --json --fast-prompt"));
    REQUIRE(old.exit_code == 0);
    CHECK(nlohmann::json::parse(old.out)["prompt_attention"] == "fast");
  }

  TEST_CASE("--compare-layer-teams adds decode with layer teams and its ratio over decode") {
    const auto r = test::run_tandem(bench_cmd("--prompt 8 --gen 4 --batch 2 --reps 2 --compare-layer-teams --json"));
    REQUIRE(r.exit_code == 0);
    const auto j = nlohmann::json::parse(r.out);
    REQUIRE(j.contains("decode_layer_teams_tok_s"));
    CHECK(j["decode_layer_teams_tok_s"].get<double>() > 0);
    const auto& teams = j["decode_layer_teams_tok_s_samples"];
    const auto& steps = j["decode_tok_s_samples"];
    const auto& ratios = j["layer_teams_vs_step_jobs_samples"];
    REQUIRE(teams.size() == 2);
    REQUIRE(ratios.size() == 2);
    for (size_t i = 0; i < 2; ++i) CHECK(ratios[i].get<double>() == doctest::Approx(teams[i].get<double>() / steps[i].get<double>()));
    CHECK(j["layer_teams_vs_step_jobs"].get<double>() == doctest::Approx((ratios[0].get<double>() + ratios[1].get<double>()) / 2));
    const auto table = test::run_tandem(bench_cmd("--prompt 8 --gen 2 --batch 2 --reps 1 --compare-layer-teams"));
    REQUIRE(table.exit_code == 0);
    CHECK(table.out.find("layer teams") != std::string::npos);
    CHECK(table.out.find("a job per step") != std::string::npos);
    // Without the flag neither the keys nor the line.
    const auto plain = nlohmann::json::parse(test::run_tandem(bench_cmd("--prompt 8 --gen 2 --batch 2 --reps 1 --json")).out);
    CHECK_FALSE(plain.contains("decode_layer_teams_tok_s"));
    CHECK_FALSE(plain.contains("layer_teams_vs_step_jobs"));
  }

  TEST_CASE("--compare-prompt adds llama.cpp's prefill and the server's ratio over it") {
    const auto r = test::run_tandem(bench_cmd("--prompt 8 --gen 2 --batch 2 --reps 2 --compare-prompt --json"));
    REQUIRE(r.exit_code == 0);
    const auto j = nlohmann::json::parse(r.out);
    CHECK(j["prompt_attention"] == "fast");
    const auto& server = j["prefill_tok_s_samples"];
    const auto& exact = j["prefill_exact_tok_s_samples"];
    const auto& ratios = j["prefill_server_vs_exact_samples"];
    REQUIRE(exact.size() == 2);
    REQUIRE(ratios.size() == 2);
    for (size_t i = 0; i < 2; ++i) CHECK(ratios[i].get<double>() == doctest::Approx(server[i].get<double>() / exact[i].get<double>()));
    CHECK(j["prefill_exact_tok_s"].get<double>() > 0);
    CHECK(j["prefill_server_vs_exact"].get<double>() == doctest::Approx((ratios[0].get<double>() + ratios[1].get<double>()) / 2));
    const auto table = test::run_tandem(bench_cmd("--prompt 8 --gen 2 --batch 2 --reps 1 --compare-prompt"));
    REQUIRE(table.exit_code == 0);
    CHECK(table.out.find("tok, llama.cpp's") != std::string::npos);
    CHECK(table.out.find("the prefill above is") != std::string::npos);
    const auto plain = nlohmann::json::parse(test::run_tandem(bench_cmd("--prompt 8 --gen 2 --batch 2 --reps 1 --json")).out);
    CHECK_FALSE(plain.contains("prefill_exact_tok_s"));
    CHECK_FALSE(plain.contains("prefill_server_vs_exact"));
    // With --exact-prompt both figures would be llama.cpp's.
    const auto both = test::run_tandem(bench_cmd("--prompt 8 --gen 2 --reps 1 --compare-prompt --exact-prompt"));
    CHECK(both.exit_code != 0);
    CHECK(both.err.find("--exact-prompt") != std::string::npos);
  }

  TEST_CASE("the table names every figure") {
    const auto r = test::run_tandem(bench_cmd("--prompt 8 --gen 2 --batch 2 --reps 1"));
    REQUIRE(r.exit_code == 0);
    for (const char* s :
         {"prefill", "decode", "batched", "tok/s", "GB/s", "read ceiling", "threads 2", "x one sequence alike", "1 seq, as batched"}) {
      CAPTURE(s);
      CHECK(r.out.find(s) != std::string::npos);
    }
  }

  TEST_CASE("a quantized model gets the int8 compute ceiling in rows per second") {
    const std::string cmd =
        "bench -m '" + test::data_path("stories260K-q8_0.gguf").string() + "' -t 2 --read-mib 16 --prompt 8 --gen 2 --batch 2 --reps 1";
    const auto r = test::run_tandem(cmd + " --json");
    REQUIRE(r.exit_code == 0);
    const auto j = nlohmann::json::parse(r.out);
    const double macs = j["int8_macs_per_token"].get<double>();
    CHECK(macs > 0);
    CHECK(j["compute_ceiling_tok_s"].get<double>() == doctest::Approx(j["dot_ceiling_gmac_s"].get<double>() * 1e9 / macs));
    CHECK(j["batched_vs_compute_ceiling"].get<double>() ==
          doctest::Approx(j["batched_decode_tok_s"].get<double>() / j["compute_ceiling_tok_s"].get<double>()));
    const auto t = test::run_tandem(cmd);
    REQUIRE(t.exit_code == 0);
    CHECK(t.out.find("int8 dot") != std::string::npos);
    CHECK(t.out.find("GMAC/s") != std::string::npos);
  }

  TEST_CASE("--isa runs the whole bench on the path asked for and says which") {
    const auto r = test::run_tandem(bench_cmd("--prompt 4 --gen 2 --batch 2 --reps 1 --isa scalar --json"));
    REQUIRE(r.exit_code == 0);
    CHECK(nlohmann::json::parse(r.out)["isa"] == "scalar");
    if (kernels::cpu::isa_supported(kernels::cpu::isa::avx2)) {
      // avx2 is what CPUs without AVX-VNNI get, even on one that has it.
      const auto avx2 = test::run_tandem(bench_cmd("--prompt 4 --gen 2 --batch 2 --reps 1 --isa avx2 --json"));
      REQUIRE(avx2.exit_code == 0);
      CHECK(nlohmann::json::parse(avx2.out)["isa"] == "avx2");
    }
    const auto vnni = test::run_tandem(bench_cmd("--prompt 4 --gen 2 --batch 2 --reps 1 --isa avxvnni --json"));
    if (kernels::cpu::cpu_has_avx_vnni()) {
      REQUIRE(vnni.exit_code == 0);
      CHECK(nlohmann::json::parse(vnni.out)["isa"] == "avxvnni");
    } else {
      CHECK(vnni.exit_code != 0);
      CHECK(vnni.err.find("AVX-VNNI") != std::string::npos);
    }
    // avx512 is what AVX-512 CPUs without AMX get, even on one that has it; amx needs the tiles.
    if (kernels::cpu::isa_supported(kernels::cpu::isa::avx512)) {
      const auto avx512 = test::run_tandem(bench_cmd("--prompt 4 --gen 2 --batch 2 --reps 1 --isa avx512 --json"));
      REQUIRE(avx512.exit_code == 0);
      CHECK(nlohmann::json::parse(avx512.out)["isa"] == "avx512");
    }
    const auto amx = test::run_tandem(bench_cmd("--prompt 4 --gen 2 --batch 2 --reps 1 --isa amx --json"));
    if (kernels::cpu::cpu_has_amx()) {
      REQUIRE(amx.exit_code == 0);
      CHECK(nlohmann::json::parse(amx.out)["isa"] == "amx");
    } else {
      CHECK(amx.exit_code != 0);
      CHECK(amx.err.find("AMX") != std::string::npos);
    }
    const auto bad = test::run_tandem(bench_cmd("--isa avx9"));
    CHECK(bad.exit_code != 0);
    CHECK(bad.err.find("--isa") != std::string::npos);
    CHECK(bad.out.empty());
  }

  TEST_CASE("bad arguments give a clear error and a non-zero exit") {
    struct bad_case {
      const char* args;
      const char* says;
    };
    for (const auto& c : {bad_case{"--prompt 0", "--prompt"}, bad_case{"--gen -1", "--gen"}, bad_case{"--batch 0", "--batch"},
                          bad_case{"--batch 100000", "--batch"}, bad_case{"--reps 0", "--reps"}, bad_case{"--threads -2", "--threads"}}) {
      CAPTURE(c.args);
      const auto r = test::run_tandem(bench_cmd(c.args));
      CHECK(r.exit_code != 0);
      CHECK(r.err.find(c.says) != std::string::npos);
      CHECK(r.out.empty());
    }
    const auto r = test::run_tandem("bench -m /nonexistent.gguf");
    CHECK(r.exit_code != 0);
    CHECK(r.err.find("/nonexistent.gguf") != std::string::npos);
  }

  TEST_CASE("bench swap --json prints one object with the swap figures") {
    const auto r = test::run_tandem("bench swap -m '" + test::data_path("stories260K.gguf").string() + "' --prompt 8 --reps 1 --threads 1 --json");
    REQUIRE(r.exit_code == 0);
    const auto j = nlohmann::json::parse(r.out);
    for (const char* k : {"bytes", "swap_in_gb_s", "copy_ceiling_gb_s", "first_token_ms_pipelined", "first_token_ms_sequential"}) {
      CAPTURE(k);
      CHECK(j[k].get<double>() > 0);
    }
    const auto bad = test::run_tandem("bench swap --prompt 8");
    CHECK(bad.exit_code != 0);
    CHECK(bad.err.find("--model") != std::string::npos);
  }
}
