// The engine's side of the planner: the arbiter's state in the planner's terms, and memory
// actions carried out on the arbiter (whole and partial loads, evictions with their slots).
#include "runtime/memory_plan.h"

#include <doctest/doctest.h>

#include <algorithm>

#include "memory/cpu_backend.h"
#include "tests/test_support.h"

using namespace tandem;

namespace {

constexpr size_t k_block = 16 << 10;

uint64_t rounded(uint64_t b) { return (b + k_block - 1) / k_block * k_block; }

policy::action act(policy::action_kind k, uint64_t bytes = 0) { return {k, "m", "test", bytes}; }

}  // namespace

TEST_SUITE("memory_plan") {
  TEST_CASE("the snapshot counts weights and KV pages per model (above its floor) and everything else as other bytes") {
    const models::model m(test::data_path("stories260K.gguf").string());
    auto backend = memory::make_cpu_backend();
    memory::arbiter a(*backend, {8 << 20, 8 << 20, k_block});
    models::arbiter_residency place(a, m, "m");
    const auto kv = a.allocate(memory::tier::device, 100 << 10, {memory::owner_kind::kv, "m", ""});
    REQUIRE(kv);
    uint64_t weights = 0;
    for (const auto& s : models::segment_sources(m)) weights += rounded(s.bytes);

    runtime::model_facts f;
    f.name = "m";
    f.running = 1;
    f.preempted = 2;
    f.queued = 3;
    const std::vector<runtime::model_facts> facts{f, {.name = "not-in-the-arbiter"}};
    auto s = runtime::planner_snapshot(a.snapshot(), k_block, facts, 12.5, 3);
    REQUIRE(s.models.size() == 1);
    CHECK(s.device_capacity == 8 << 20);
    CHECK(s.host_capacity == 8 << 20);
    CHECK(s.link_gb_s == 12.5);
    CHECK(s.disk_gb_s == 3);
    CHECK(s.device_other == 0);
    CHECK(s.models[0].kv_device_bytes == kv->bytes);  // its pages leave with it
    CHECK(s.models[0].weight_bytes == weights);
    CHECK_FALSE(s.models[0].on_device);
    CHECK_FALSE(s.models[0].on_host);
    CHECK(s.models[0].running == 1);
    CHECK(s.models[0].preempted == 2);
    CHECK_FALSE(runtime::runnable(a.snapshot(), "m"));

    CHECK(runtime::apply_memory_action(place, act(policy::action_kind::stage)) == memory::status::ok);
    CHECK(runtime::apply_memory_action(place, act(policy::action_kind::load)) == memory::status::ok);
    a.wait_idle(place.id());
    s = runtime::planner_snapshot(a.snapshot(), k_block, facts, 12.5, 3);
    CHECK(s.models[0].on_device);
    CHECK(s.models[0].device_bytes == 0);  // all of it
    CHECK(s.models[0].on_host);
    CHECK(s.device_other == 0);
    CHECK(runtime::runnable(a.snapshot(), "m"));
    // A floor it keeps whatever happens counts as other bytes, like scratch.
    auto floored = facts;
    floored[0].kv_floor_bytes = kv->bytes;
    s = runtime::planner_snapshot(a.snapshot(), k_block, floored, 12.5, 3);
    CHECK(s.models[0].kv_device_bytes == 0);
    CHECK(s.device_other == kv->bytes);
    const auto scratch = a.allocate(memory::tier::device, 64 << 10, {memory::owner_kind::scratch, "", ""});
    REQUIRE(scratch);
    s = runtime::planner_snapshot(a.snapshot(), k_block, facts, 12.5, 3);
    CHECK(s.device_other == scratch->bytes);
    a.release(*scratch);

    const auto d = runtime::planner_demand(facts);
    REQUIRE(d.models.size() == 2);
    CHECK(d.models[0].name == "m");
    CHECK(d.models[0].queued == 3);
    a.release(*kv);
    CHECK(runtime::apply_memory_action(place, act(policy::action_kind::evict_device)) == memory::status::ok);
    CHECK(runtime::apply_memory_action(place, act(policy::action_kind::evict_host)) == memory::status::ok);
    CHECK(a.snapshot().device.used == 0);
    CHECK(a.snapshot().host.used == 0);
    a.check_integrity();
  }

  TEST_CASE("a partial load streams the rest through slots; evicting returns them") {
    const models::model m(test::data_path("stories260K.gguf").string());
    auto backend = memory::make_cpu_backend();
    memory::arbiter a(*backend, {8 << 20, 8 << 20, k_block});
    models::arbiter_residency place(a, m, "m");
    const auto segs = models::segment_sources(m);
    REQUIRE(segs.size() >= 3);
    const uint64_t first_two = rounded(segs[0].bytes) + rounded(segs[1].bytes);
    CHECK(runtime::apply_memory_action(place, act(policy::action_kind::load, first_two)) == memory::status::ok);
    a.wait_idle(place.id());
    auto snap = a.snapshot();
    REQUIRE(snap.models.size() == 1);
    CHECK(snap.models[0].segments[0].device == memory::residency::resident);
    CHECK(snap.models[0].segments[1].device == memory::residency::resident);
    CHECK(snap.models[0].segments[2].device == memory::residency::absent);
    CHECK(snap.models[0].stream_slots == place.prefetch_depth() + 1);
    CHECK(runtime::runnable(snap, "m"));
    const std::vector<runtime::model_facts> facts{{.name = "m"}};
    uint64_t largest = 0, weights = 0;
    for (const auto& sg : segs) {
      largest = std::max(largest, rounded(sg.bytes));
      weights += rounded(sg.bytes);
    }
    const auto s = runtime::planner_snapshot(snap, k_block, facts, 25, 2);
    CHECK(s.models[0].on_device);
    // The slots are the model's own device bytes; it is on the device in part.
    CHECK(s.models[0].device_bytes == std::min(first_two + 3 * largest, weights - 1));
    CHECK(s.device_other == 0);

    // Slots alone (nothing of its own on the device) still count as on the device, in part.
    CHECK(runtime::apply_memory_action(place, act(policy::action_kind::evict_device)) == memory::status::ok);
    REQUIRE(place.prepare_streaming() == memory::status::ok);
    const auto alone = runtime::planner_snapshot(a.snapshot(), k_block, facts, 25, 2);
    CHECK(alone.models[0].on_device);
    CHECK(alone.models[0].device_bytes == std::min(3 * largest, weights - 1));
    CHECK(runtime::runnable(a.snapshot(), "m"));

    // The rest comes on when there is room: the slots go back.
    CHECK(runtime::apply_memory_action(place, act(policy::action_kind::load)) == memory::status::ok);
    a.wait_idle(place.id());
    CHECK(a.snapshot().models[0].stream_slots == 0);

    CHECK(runtime::apply_memory_action(place, act(policy::action_kind::load, first_two)) == memory::status::ok);
    CHECK(runtime::apply_memory_action(place, act(policy::action_kind::evict_device)) == memory::status::ok);
    snap = a.snapshot();
    CHECK(snap.models[0].stream_slots == 0);
    CHECK(snap.device.used == 0);
    CHECK_FALSE(runtime::runnable(snap, "m"));
    // Preempt and resume are the engine's: nothing happens here.
    CHECK(runtime::apply_memory_action(place, act(policy::action_kind::preempt)) == memory::status::ok);
    CHECK(a.snapshot().device.used == 0);
    a.check_integrity();
  }

  TEST_CASE("a load into a device too small for the model streams what does not fit") {
    const models::model m(test::data_path("stories260K.gguf").string());
    const auto segs = models::segment_sources(m);
    uint64_t largest = 0;
    for (const auto& s : segs) largest = std::max(largest, rounded(s.bytes));
    auto backend = memory::make_cpu_backend();
    // Room for the three stream slots and about two segments more.
    memory::arbiter a(*backend, {5 * largest, 8 << 20, k_block});
    models::arbiter_residency place(a, m, "m");
    CHECK(runtime::apply_memory_action(place, act(policy::action_kind::load)) == memory::status::ok);
    a.wait_idle(place.id());
    const auto snap = a.snapshot();
    CHECK(snap.models[0].stream_slots == 3);
    CHECK(runtime::runnable(snap, "m"));
    int on = 0;
    for (const auto& s : snap.models[0].segments) on += s.device != memory::residency::absent;
    CHECK(on >= 1);
    CHECK(on < static_cast<int>(segs.size()));
    a.check_integrity();
  }
}
