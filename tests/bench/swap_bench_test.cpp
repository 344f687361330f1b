// bench/swap_bench on the committed tiny model: every figure measured, the bytes those of the
// model's segments, the JSON keys the issue names.
#include "bench/swap_bench.h"

#include <doctest/doctest.h>

#include "models/model.h"
#include "models/weight_plan.h"
#include "tests/test_support.h"

using namespace tandem;

TEST_SUITE("bench_swap") {
  TEST_CASE("a run measures each phase and reports the issue's keys") {
    bench::swap_bench_options o;
    o.model_path = test::data_path("stories260K.gguf").string();
    o.prompt = 8;
    o.reps = 2;
    o.threads = 1;
    const auto r = bench::run_swap_bench(o);
    const models::model m(o.model_path, {.own_weights = false});
    CHECK(r.bytes == m.plan().total_bytes());
    CHECK(r.segments == m.plan().last_segment() + 1);
    CHECK(r.swap_in_gb_s.count == 2);
    for (const auto* s : {&r.stage_s, &r.swap_in_s, &r.swap_in_gb_s, &r.copy_ceiling_gb_s, &r.first_token_ms_resident, &r.first_token_ms_pipelined,
                          &r.first_token_ms_sequential})
      CHECK(s->median > 0);
    const auto j = bench::to_json(r);
    for (const char* k : {"bytes", "swap_in_gb_s", "copy_ceiling_gb_s", "first_token_ms_pipelined", "first_token_ms_sequential"}) {
      CAPTURE(k);
      REQUIRE(j.contains(k));
      CHECK(j[k].get<double>() > 0);
    }
    CHECK(j["link_simulated"] == false);
    CHECK(bench::format_table(r).find("pipelined / sequential") != std::string::npos);
  }

  TEST_CASE("bad settings are refused") {
    bench::swap_bench_options o;
    o.model_path = test::data_path("stories260K.gguf").string();
    o.reps = 0;
    CHECK_THROWS_AS(bench::run_swap_bench(o), std::invalid_argument);
  }
}
