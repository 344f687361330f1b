// serve's placement checks, shared with `serve --check`: on stated sizes, on model files, and
// the same message from both.
#include "runtime/roster_check.h"

#include <doctest/doctest.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "configs/roster_loader.h"
#include "runtime/served_roster.h"
#include "tests/test_support.h"

using namespace tandem;

namespace {

// What check_placement says of a roster, from stated sizes where files are absent.
std::string verdict(const configs::roster& r) {
  std::vector<std::unique_ptr<models::model>> files;
  std::vector<runtime::model_needs> needs;
  for (const auto& e : r.models) {
    const bool present = e.file.find("stories260K") != std::string::npos;
    files.push_back(present ? std::make_unique<models::model>(e.file, models::load_options{.own_weights = false}) : nullptr);
    needs.push_back(runtime::needs_of(e, files.back().get(), kernels::cpu::kv_type::f16));
  }
  try {
    runtime::check_placement(r, needs, runtime::page_unit_of(needs));
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  return "OK";
}

// chat (line 6) and code (line 12), with extra keys for each, and the policy after them.
std::string stated(const std::string& vram, const std::string& chat = "", const std::string& code = "", const std::string& tail = "") {
  return "devices:\n  - backend: cpu\n    vram: " + vram +
         "\n    host: 8GiB\nmodels:\n"
         "  - name: chat\n    path: nowhere/chat.gguf\n    size: 2GiB\n    kv_bytes_per_token: 64KiB\n    context: 4096\n    max_sequences: 4\n" +
         chat + "  - name: code\n    path: nowhere/code.gguf\n    size: 512MiB\n    kv_bytes_per_token: 16KiB\n    role: code\n" + code + tail;
}

configs::roster parse(const std::string& yaml) { return configs::parse_roster(yaml, "r.yaml", "", {.require_files = false}); }

}  // namespace

TEST_SUITE("roster_check") {
  TEST_CASE("KV is a limit, not a reservation: a roster whose full KV exceeds the device passes") {
    // 4 x 4096 x 64 KiB = 1 GiB of chat KV and 4 x 4096 x 16 KiB of code KV beside 2.5 GiB of
    // weights on a 3 GiB device.
    CHECK(verdict(parse(stated("3GiB", ""))) == "OK");
    CHECK(runtime::page_unit_of(std::vector<runtime::model_needs>{{.kv_bytes_per_token = 64 << 10}, {.kv_bytes_per_token = 16 << 10}}) == 64u << 10);
    CHECK(runtime::page_unit_of(std::vector<runtime::model_needs>{{.kv_bytes_per_token = 640}}) == 2048);  // a 10 KiB block
  }

  TEST_CASE("the KV pages a model can hold beside its weights, the pinned weights and the others' floors") {
    const auto pages = [](const configs::roster& r, size_t i) {
      std::vector<runtime::model_needs> needs;
      for (const auto& e : r.models) needs.push_back(runtime::needs_of(e, nullptr, runtime::kv_type_of(e.kv_type)));
      return runtime::kv_pages_beside_weights(r, needs, runtime::page_unit_of(needs), i);
    };
    // chat: 2 GiB of weights, pages of 16 x 64 KiB = 1 MiB, at most 4 x 4096 / 16 = 1024.
    CHECK(pages(parse(stated("2560MiB")), 0) == 512);
    CHECK(pages(parse(stated("4GiB")), 0) == 1024);                                    // its limit
    CHECK(pages(parse(stated("2560MiB", "", "    kv_reserve: 128MiB\n")), 0) == 384);  // code's floor stays
    CHECK(pages(parse(stated("2560MiB", "", "    pinned: true\n")), 0) == 0);          // code's weights stay: no room
    // q4_0: 18 KiB a position (9/32 of f16's 64 KiB), pages of 288 KiB.
    CHECK(pages(parse(stated("2304MiB", "    kv_type: q4_0\n")), 0) == 256 * 1024 / 288);
  }

  TEST_CASE("what serve refuses is refused, naming the model, its line and the sizes") {
    // chat holds at most 4 x 4096 x 64 KiB = 1 GiB of KV, code 4 x 4096 x 16 KiB = 256 MiB.
    CHECK(verdict(parse(stated("1GiB", "    kv_reserve: 1GiB\n", "    kv_reserve: 128MiB\n"))) ==
          "r.yaml: the KV floors (kv_reserve) need 1.1 GiB, more than the device budget of 1.0 GiB");
    CHECK(verdict(parse(stated("3GiB", "    kv_reserve: 1GiB\n", "    kv_reserve: 200MiB\n"))) ==
          "model 'chat' (line 6) cannot run on a device budget of 3.0 GiB: it needs 2.0 GiB of weights and a KV page beside 1.2 GiB of KV floors "
          "(kv_reserve)");
    CHECK(verdict(parse(stated("3GiB", "", "    kv_reserve: 512MiB\n"))) ==
          "model 'code' (line 12): kv_reserve 512.0 MiB is more than it can hold (4 x 4096 positions: 256.0 MiB)");
    CHECK(verdict(parse(stated("2GiB", "", "", "policy:\n  stream: false\n"))) ==
          "model 'chat' (line 6) cannot run on a device budget of 2.0 GiB: it needs 2.0 GiB of weights and a KV page beside 0 B of KV floors "
          "(kv_reserve)");
    // A kv_limit below one block: the loader refuses it where the roster states the KV per
    // token; with only the file to tell, the check does.
    CHECK_THROWS_AS(parse(stated("3GiB", "", "    kv_limit: 8KiB\n")), configs::config_error);
    const std::string tiny = "devices:\n  - backend: cpu\n    vram: 8MiB\n    host: 8MiB\nmodels:\n  - name: tiny\n    path: " +
                             test::data_path("stories260K.gguf").string() + "\n    kv_limit: 4KiB\n";
    CHECK(verdict(configs::parse_roster(tiny, "r.yaml", ".")) ==
          "model 'tiny' (line 6): kv_limit 4.0 KiB is less than one KV page (16 positions, 10.0 KiB of the device)");
  }

  TEST_CASE("a KV cache type the model's heads do not suit is refused by both, naming model, line and type") {
    // stories260K's heads are 8 wide: no whole 32-value block for q8_0 or q4_0.
    for (const std::string type : {"q8_0", "q4_0"}) {
      CAPTURE(type);
      const std::string yaml = "devices:\n  - backend: cpu\n    vram: 8MiB\n    host: 8MiB\nmodels:\n  - name: tiny\n    path: " +
                               test::data_path("stories260K.gguf").string() + "\n    kv_type: " + type + "\n";
      const auto r = configs::parse_roster(yaml, "r.yaml", ".");
      const std::string want = "model 'tiny' (line 6): kv_type " + type + (type == "q4_0" ? ", rotated" : "") + ": a " + type +
                               " KV cache needs heads of a multiple of 32 elements (the model's heads are 8 wide)";
      const models::model m(r.models[0].file, models::load_options{.own_weights = false});
      CHECK_THROWS_WITH_AS(runtime::needs_of(r.models[0], &m, runtime::kv_type_of(r.models[0].kv_type)), want.c_str(), std::runtime_error);
      try {
        runtime::served_roster s(r, {.threads = 1});
        FAIL("served a roster the check refuses");
      } catch (const std::runtime_error& e) {
        CHECK(std::string(e.what()) == want);
      }
    }
  }

  TEST_CASE("serve and the check give the same message for the same roster") {
    const std::string yaml = "devices:\n  - backend: cpu\n    vram: 1MiB\n    host: 8MiB\nmodels:\n  - name: tiny\n    path: " +
                             test::data_path("stories260K.gguf").string() + "\n    kv_reserve: 900KiB\n    context: 512\n";
    const auto r = configs::parse_roster(yaml, "r.yaml", ".");
    const std::string checked = verdict(r);
    CHECK(checked.find("model 'tiny' (line 6) cannot run") == 0);
    try {
      runtime::served_roster s(r, {.threads = 1});
      FAIL("served a roster the check refuses");
    } catch (const std::runtime_error& e) {
      CHECK(std::string(e.what()) == checked);
    }
  }
}
