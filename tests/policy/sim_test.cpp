#include "policy/sim.h"

#include <doctest/doctest.h>

#include <cmath>
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
    // Staged from disk (1 s), copied to the device (0.1 s) while the prompt's pass runs over
    // the layers as they land: it starts once the first of 32 layers is there (3.125 ms) and
    // takes 1 s, longer than the copy. Then two decode steps of 10 ms.
    CHECK(m.ttft_p50_ms == doctest::Approx(1000 + 3.125 + 1000).epsilon(1e-6));
    CHECK(m.e2e_p95_ms == doctest::Approx(2003.125 + 20).epsilon(1e-6));
    CHECK(m.swaps == 1);
    CHECK(m.gb_moved == doctest::Approx(2.0));  // staged, then loaded
    CHECK(m.slo_attainment == 1.0);
    // A process-per-model server reads the file on load and starts a process: 1.1 + 0.2 s.
    const auto ex = policy::simulate(one_model("exclusive"), t, reqs);
    CHECK(ex.models.at("m").ttft_p50_ms == doctest::Approx(2300).epsilon(1e-6));
  }

  TEST_CASE("interleaving: a higher-priority request runs at the next layer boundary of a lower one's pass") {
    auto roster = [](bool interleave) {
      return configs::parse_roster(std::string(R"(devices:
  - vram: 10GB
    host: 20GB
models:
  - name: lo
    path: none
    size: 1GB
    kv_bytes_per_token: 1KB
    priority: 10
  - name: hi
    path: none
    size: 1GB
    kv_bytes_per_token: 1KB
    priority: 80
policy:
  interleave: )") + (interleave ? "true" : "false") +
                                       "\n",
                                   "r.yaml", "", {.require_files = false});
    };
    const auto on = roster(true), off = roster(false);
    const auto t = configs::parse_trace(R"(length: 1m
costs:
  link_gb_s: 10
  disk_gb_s: 1
  step_overhead: 0ms
  models:
    lo: {prefill_tok_s: 1000, decode_tok_s: 100, layers: 10}
    hi: {prefill_tok_s: 1000, decode_tok_s: 100, layers: 10}
requests:
  - {at: 0s, model: lo, prompt: 100, output: 1}
  - {at: 0s, model: hi, prompt: 100, output: 1}
  - {at: 10s, model: lo, prompt: 2000, output: 1}
  - {at: 10.2s, model: hi, prompt: 100, output: 1}
)",
                                        "t.yaml", on);
    const auto reqs = policy::expand_trace(t, t.seed);
    // At 10 s lo's first pass takes 512 prompt rows: 512 ms, 51.2 ms a layer. hi's request at
    // 10.2 s runs after lo's fourth layer (10.2048 s) and takes 100 ms.
    const auto a = policy::simulate(on, t, reqs);
    CHECK(a.models.at("hi").ttft_p50_ms == doctest::Approx(104.8).epsilon(1e-6));
    // Without interleaving it waits for lo's pass to end (10.512 s).
    const auto b = policy::simulate(off, t, reqs);
    CHECK(b.models.at("hi").ttft_p50_ms == doctest::Approx(412).epsilon(1e-6));
    // lo's prompt takes 2 s of passes either way, plus hi's 100 ms in between. (lo's other
    // request, the cold start, took 2110 ms: staged after hi's, copied, one layer, prefilled.)
    REQUIRE(a.models.at("lo").ttft_ms.size() == 2);
    CHECK(a.models.at("lo").ttft_ms.front() == doctest::Approx(2100).epsilon(1e-6));
    CHECK(b.models.at("lo").ttft_ms.front() == doctest::Approx(2100).epsilon(1e-6));
  }

  TEST_CASE("a pass with a prompt chunk carries the decode rows at prompt-row cost") {
    const auto r = one_model("tandem");
    // The second request's prompt (500 rows) is prefilled while the first decodes: its pass
    // costs (500 + 1) / 1000 s, not 500 ms plus a 10 ms decode step.
    const auto t = trace_for(r, "requests:\n  - {at: 0s, model: m, prompt: 10, output: 1000}\n  - {at: 3s, model: m, prompt: 500, output: 1}\n");
    const auto res = policy::simulate(r, t, policy::expand_trace(t, t.seed));
    const auto& m = res.models.at("m");
    REQUIRE(m.ttft_ms.size() == 2);
    // The first token came at 1.1003125 s: the copy (to 1.1 s) and then its last layer. The
    // second request arrives at 3 s, during a decode step (10 ms each since), and waits for
    // that step's end.
    CHECK(m.ttft_ms.back() == doctest::Approx(1100.3125).epsilon(1e-6));
    const double step_end = 1.1003125 + std::ceil((3.0 - 1.1003125) / 0.01) * 0.01;
    CHECK(m.ttft_ms.front() == doctest::Approx((step_end - 3.0 + 0.501) * 1e3).epsilon(1e-6));
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
