#include "runtime/placement.h"

#include <doctest/doctest.h>

#include <stdexcept>

#include "models/weight_plan.h"
#include "tests/test_support.h"

using namespace tandem;

TEST_SUITE("placement") {
  TEST_CASE("budgets decide what is resident, staged and streamed; the books balance") {
    const models::model m(test::data_path("stories260K.gguf").string(), {.own_weights = false});
    runtime::placement_options o;
    o.backend.kind = memory::backend_kind::cpu;
    o.n_ctx = 64;
    o.host_bytes = 8 << 20;
    o.wait = true;
    SUBCASE("everything fits") {
      o.device_bytes = 8 << 20;
      const auto p = runtime::place_model(m, "s", o);
      CHECK(p->on_device == p->segments);
      CHECK(p->staged == p->segments);
      CHECK(p->stream_slots == 0);
      // Sized for the context, reserved by whoever runs it (the engine, as its prompts need).
      CHECK(p->kv->total_blocks() * p->kv->block_tokens() >= 64);
      CHECK(p->kv->free_blocks() == p->kv->total_blocks());
      REQUIRE(p->scratch);
      CHECK(p->scratch->bytes >= models::forward_context::scratch_bytes(m.config(), runtime::placed_context(*p, o)));
      p->arbiter->check_integrity();
    }
    SUBCASE("part of it: slots for the prefetch depth, then what fits") {
      o.device_bytes = 1 << 20;
      const auto p = runtime::place_model(m, "s", o);
      CHECK(p->stream_slots == 3);
      CHECK(p->on_device > 0);
      CHECK(p->on_device < p->segments);
    }
    SUBCASE("no host budget: nothing staged, streaming fills from the file") {
      o.device_bytes = 448 << 10;  // KV cache, scratch and one slot: 64 + 192 + 192 KiB
      o.host_bytes = 0;
      const auto p = runtime::place_model(m, "s", o);
      CHECK(p->staged == 0);
      CHECK(p->stream_slots == 1);
      CHECK(p->on_device == 0);
    }
    SUBCASE("impossible budgets are errors naming the sizes") {
      o.device_bytes = 512 << 10;
      o.allow_streaming = false;
      CHECK_THROWS_WITH_AS(runtime::place_model(m, "s", o), doctest::Contains("need 1.1 MiB of device memory"), std::runtime_error);
      o.allow_streaming = true;
      o.device_bytes = 384 << 10;
      CHECK_THROWS_WITH_AS(runtime::place_model(m, "s", o), doctest::Contains("needs one stream slot"), std::runtime_error);
      o.device_bytes = 200 << 10;
      CHECK_THROWS_WITH_AS(runtime::place_model(m, "s", o), doctest::Contains("activation scratch"), std::runtime_error);
      o.device_bytes = 0;
      CHECK_THROWS_WITH_AS(runtime::place_model(m, "s", o), doctest::Contains("KV cache"), std::runtime_error);
    }
  }
}
