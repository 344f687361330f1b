// bench/serve_bench on the committed tiny model: every figure measured and the JSON keys the
// issue names present (never how fast: tests check that the bench runs and reports).
#include "bench/serve_bench.h"

#include <doctest/doctest.h>

#include "tests/test_support.h"

using namespace tandem;

TEST_SUITE("bench_serve") {
  TEST_CASE("a short run reports every figure under the issue's keys") {
    bench::serve_bench_options o;
    o.model_path = test::data_path("stories260K.gguf").string();
    o.threads = 2;
    o.gen = 8;
    o.long_prompt = 300;
    o.reps = 2;
    const auto r = bench::run_serve_bench(o);
    for (const int c : {1, 4, 16}) {
      CHECK(r.decode_tok_s.at(c) > 0);
      CHECK(r.decode_rounds.at(c).count == 2);
      CHECK(r.decode_rounds.at(c).min <= r.decode_tok_s.at(c));
      CHECK(r.decode_tok_s.at(c) <= r.decode_rounds.at(c).max);
    }
    CHECK(r.decode_16_vs_1.count == 2);
    CHECK(r.decode_16_vs_1.median > 0);
    CHECK(r.itl_p99_ms_idle > 0);
    CHECK(r.long_prompt_ttft_ms > 0);
    CHECK(r.long_prompt_ttft_ms_alone > 0);
    CHECK(r.burst_ttft_ms_idle > 0);
    CHECK(r.burst_ttft_ms_contended > 0);
    CHECK(r.prefix_miss_ttft_ms > 0);
    CHECK(r.prefix_hit_ttft_ms > 0);
    CHECK(r.interleave.high_ttft_ms_interleaved > 0);
    CHECK(r.interleave.high_ttft_ms_waiting > 0);
    CHECK(r.interleave.low_pass_ms > 0);
    CHECK(r.dot_ceiling_gmac_s > 0);
    CHECK(r.int8_macs_per_token == 0);  // F32 weights: no int8 products
    CHECK(r.compute_ceiling_tok_s() == 0);
    const auto j = bench::to_json(r, o);
    for (const char* k : {"decode_tok_s", "itl_p99_ms_idle", "itl_p99_ms_during_prefill", "burst_ttft_ms_idle", "burst_ttft_ms_contended",
                          "prefix_hit_ttft_ms", "prefix_miss_ttft_ms", "interleave_high_ttft_ms", "no_interleave_high_ttft_ms", "dot_ceiling_gmac_s",
                          "compute_ceiling_tok_s", "decode_16_vs_compute_ceiling", "decode_16_vs_1", "decode_tok_s_min_max"}) {
      CAPTURE(k);
      CHECK(j.contains(k));
    }
    for (const char* c : {"1", "4", "16"}) CHECK(j["decode_tok_s"].contains(c));
    CHECK(bench::format_table(r, o).find("burst TTFT") != std::string::npos);
  }
}
