#include "policy/sim.h"

#include <doctest/doctest.h>

#include <string>

#include "configs/roster_loader.h"
#include "configs/trace_loader.h"
#include "policy/sim_report.h"

using namespace tandem;

namespace {

configs::roster one_model(const std::string& policy) {
  return configs::parse_roster(R"(devices:
  - vram: 4GB
    host: 8GB
models:
  - name: m
    path: none
    size: 1GB
    kv_bytes_per_token: 1KB
    context: 4096
    max_sequences: 2
policy:
  name: )" + policy + "\n",
                               "r.yaml", "", {.require_files = false});
}

configs::trace_spec trace_for(const configs::roster& r, const std::string& body) {
  return configs::parse_trace(R"(length: 1m
costs:
  link_gb_s: 10
  disk_gb_s: 1
  step_overhead: 0ms
  process_start: 200ms
  models:
    m: {prefill_tok_s: 1000, decode_tok_s: 100, batch_gain: 1}
slo:
  m: 3s
)" + body,
                              "t.yaml", r);
}

}  // namespace

TEST_SUITE("sim") {
  TEST_CASE("one request: TTFT is staging, the copy and the prefill, as the cost model says") {
    const auto r = one_model("tandem");
    const auto t = trace_for(r, "requests:\n  - {at: 0s, model: m, prompt: 1000, output: 3}\n");
    const auto reqs = policy::expand_trace(t, t.seed);
    REQUIRE(reqs.size() == 1);
    const auto res = policy::simulate(r, t, reqs);
    const auto& m = res.models.at("m");
    // Staged from disk (1 s), copied to the device (0.1 s), prefilled (1 s), then two decode
    // steps of 10 ms.
    CHECK(m.ttft_p50_ms == doctest::Approx(2100).epsilon(1e-6));
    CHECK(m.e2e_p95_ms == doctest::Approx(2120).epsilon(1e-6));
    CHECK(m.swaps == 1);
    CHECK(m.gb_moved == doctest::Approx(2.0));  // staged, then loaded
    CHECK(m.slo_attainment == 1.0);
    // A process-per-model server reads the file on load and starts a process: 1.1 + 0.2 s.
    const auto ex = policy::simulate(one_model("exclusive"), t, reqs);
    CHECK(ex.models.at("m").ttft_p50_ms == doctest::Approx(2300).epsilon(1e-6));
  }

  TEST_CASE("generators: seeded, deterministic, the same shape for another seed") {
    const auto r = one_model("tandem");
    const auto t = trace_for(r, R"(streams:
  - {model: m, kind: poisson, rate: 2/s, prompt: {min: 10, max: 20}, output: 5}
  - {model: m, kind: bursts, rate: 5/s, on: 5s, off: 10s, prompt: 10, output: {min: 1, max: 3}}
)");
    const auto a = policy::expand_trace(t, 1), b = policy::expand_trace(t, 1), c = policy::expand_trace(t, 2);
    REQUIRE(a.size() == b.size());
    for (size_t i = 0; i < a.size(); ++i) {
      CHECK(a[i].arrive == b[i].arrive);
      CHECK(a[i].prompt == b[i].prompt);
      CHECK(a[i].arrive >= 0);
      CHECK(a[i].arrive < 60);
      if (i > 0) CHECK(a[i].arrive >= a[i - 1].arrive);
    }
    CHECK((a.size() != c.size() || a.front().arrive != c.front().arrive));
    // 2/s for 60 s plus bursts: far more than the Poisson stream alone could give by chance.
    CHECK(a.size() > 80);
    CHECK(a.size() < 400);
  }

  TEST_CASE("a whole replay is deterministic, byte for byte") {
    const auto r = one_model("tandem");
    const auto t = trace_for(r, "streams:\n  - {model: m, kind: poisson, rate: 1/s, prompt: {min: 100, max: 900}, output: {min: 1, max: 50}}\n");
    const auto reqs = policy::expand_trace(t, 7);
    const std::vector<policy::sim_result> one{policy::simulate(r, t, reqs)}, two{policy::simulate(r, t, reqs)};
    CHECK(policy::format_sim_table(one) == policy::format_sim_table(two));
    CHECK(policy::sim_to_json(one).dump() == policy::sim_to_json(two).dump());
    const auto svg = policy::sim_plot_svg(one, "t");
    CHECK(svg.find("<svg") == 0);
    CHECK(svg.find("<polyline") != std::string::npos);
    const auto j = policy::sim_to_json(one);
    for (const char* k : {"ttft_p50_ms", "ttft_p95_ms", "ttft_p99_ms", "slo_attainment", "swaps", "gb_moved"}) {
      CAPTURE(k);
      CHECK(j["tandem"]["m"].contains(k));
    }
  }
}
