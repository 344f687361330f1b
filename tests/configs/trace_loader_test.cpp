#include "configs/trace_loader.h"

#include <doctest/doctest.h>

#include "tests/test_support.h"

using namespace tandem;

namespace {
std::string repo_file(const std::string& rel) { return (test::data_path("..") / ".." / rel).lexically_normal().string(); }
}  // namespace

TEST_SUITE("trace_loader") {
  TEST_CASE("the office day loads against the office roster") {
    const auto r = configs::load_roster(repo_file("configs/office-24gb.yaml"), {.require_files = false});
    const auto t = configs::load_trace(repo_file("configs/traces/office-day.yaml"), r);
    CHECK(t.length == std::chrono::hours(8));
    CHECK(t.streams.size() == 3);
    CHECK(t.streams[0].bursts);
    CHECK(t.streams[0].rate_per_s == doctest::Approx(1.0));
    CHECK(t.slo_ttft.at("code") == std::chrono::milliseconds(300));
    CHECK(t.costs.models.at("chat").decode_tok_s > 0);
    CHECK(t.costs.models.at("chat").layers == 64);
    CHECK(t.costs.models.at("code").layers == 28);
  }

  TEST_CASE("errors name the key and line") {
    const auto r = configs::load_roster(repo_file("configs/office-24gb.yaml"), {.require_files = false});
    auto error_of = [&](const std::string& yaml) {
      try {
        configs::parse_trace(yaml, "t.yaml", r);
      } catch (const configs::config_error& e) {
        return std::string(e.what());
      }
      return std::string("(no error)");
    };
    const std::string costs = "costs:\n  models:\n    chat: {prefill_tok_s: 1, decode_tok_s: 1}\n    code: {prefill_tok_s: 1, decode_tok_s: 1}\n";
    CHECK(error_of(costs + "streams:\n  - {model: ghost, rate: 1/s, prompt: 1, output: 1}\n")
              .find("t.yaml:6:13: streams[0].model: no model named 'ghost'") != std::string::npos);
    CHECK(error_of(costs + "streams:\n  - {model: chat, rate: fast, prompt: 1, output: 1}\n").find("streams[0].rate: expected a rate") !=
          std::string::npos);
    CHECK(error_of(costs + "streams:\n  - {model: chat, kind: bursts, rate: 1/s, prompt: 1, output: 1}\n").find("needs on and off") !=
          std::string::npos);
    CHECK(error_of("costs:\n  models:\n    chat: {prefill_tok_s: 1, decode_tok_s: 1}\n").find("no costs for model 'code'") != std::string::npos);
    CHECK(error_of(costs + "lenght: 1h\n").find("lenght: unknown key") != std::string::npos);
    CHECK(error_of("costs:\n  models:\n    chat: {prefill_tok_s: 1, decode_tok_s: 1, layers: 0}\n    code: {prefill_tok_s: 1, decode_tok_s: 1}\n")
              .find("costs.models.chat.layers") != std::string::npos);
  }
}
