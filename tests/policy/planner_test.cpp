// The planner's rules, each on a hand-built snapshot with an injected clock.
#include "policy/planner.h"

#include <doctest/doctest.h>

#include <string>

#include "configs/roster_loader.h"

using namespace tandem;
using namespace std::chrono_literals;
using policy::action_kind;

namespace {

// Three models stated in GB; a 10 GB device, 30 GB host. chat (prio 20, 6 GB), code (prio
// 80, 3 GB), aux (prio 10, 3 GB). KV: 1 MB per token, 1000 positions -> 1 GB per sequence.
configs::roster roster(const std::string& extra_chat = "", const std::string& policy = "") {
  const std::string yaml = R"(devices:
  - vram: 10GB
    host: 30GB
models:
  - name: chat
    path: none
    priority: 20
    size: 6GB
    kv_bytes_per_token: 1MB
    context: 1000
    max_sequences: 1
)" + extra_chat + R"(  - name: code
    path: none
    role: code
    priority: 80
    size: 3GB
    kv_bytes_per_token: 1MB
    context: 1000
    max_sequences: 1
  - name: aux
    path: none
    priority: 10
    size: 3GB
    kv_bytes_per_token: 1MB
    context: 1000
    max_sequences: 1
policy:
  hysteresis: 2s
  max_wait: 10s
)" + policy;
  return configs::parse_roster(yaml, "test.yaml", "", {.require_files = false});
}

const policy::time_point t0 = policy::time_point{} + 1h;

policy::model_state state(const std::string& name, uint64_t gb, bool device, bool host = true) {
  policy::model_state s;
  s.name = name;
  s.weight_bytes = gb * 1000000000ull;
  s.on_device = device;
  s.on_host = host;
  s.last_used = t0 - 1min;  // within the default keep_alive of 5m
  s.loaded_at = t0 - 10min;
  return s;
}

policy::snapshot snap(std::vector<policy::model_state> models) {
  policy::snapshot s;
  s.device_capacity = 10000000000ull;
  s.host_capacity = 30000000000ull;
  s.models = std::move(models);
  return s;
}

policy::demand wants(const std::string& name, int queued, policy::time_point oldest = t0, double rate = 0) {
  policy::demand d;
  d.models.push_back({name, queued, oldest, rate});
  return d;
}

bool has(const policy::plan& p, action_kind k, const std::string& model) {
  for (const auto& a : p.actions)
    if (a.kind == k && a.model == model) return true;
  return false;
}

}  // namespace

TEST_SUITE("planner") {
  TEST_CASE("a demanded model evicts an idle lower-priority one, cheapest to bring back first") {
    const auto r = roster();
    // chat (6 GB) and aux (3 GB) on the device: 9 of 10 GB. code (3 GB + 1 GB KV) is asked for.
    auto s = snap({state("chat", 6, true), state("code", 3, false), state("aux", 3, true)});
    const auto p = policy::plan_tandem(r, s, wants("code", 1), t0);
    CHECK(has(p, action_kind::evict_device, "aux"));  // lowest priority, smallest reload
    CHECK_FALSE(has(p, action_kind::evict_device, "chat"));
    CHECK(has(p, action_kind::load, "code"));
    CHECK(p.run == "code");
    // Evictions come before the load.
    CHECK(p.actions.front().kind == action_kind::evict_device);
    CHECK(p.actions.back().kind == action_kind::load);
  }

  TEST_CASE("a model on the device short of KV pages gets room from an idle lower-priority one") {
    const auto r = roster();
    // chat (6 GB) and aux (3 GB) on the device; chat's preempted sequence wants 2 GB of KV back.
    auto chat = state("chat", 6, true);
    chat.preempted = 1;
    chat.kv_wanted_bytes = 2000000000ull;
    auto s = snap({chat, state("code", 3, false), state("aux", 3, true)});
    const auto p = policy::plan_tandem(r, s, wants("chat", 0), t0);
    CHECK(has(p, action_kind::evict_device, "aux"));
    CHECK(p.run == "chat");
    // Enough free memory: nothing moves.
    chat.kv_wanted_bytes = 500000000ull;
    const auto q = policy::plan_tandem(r, snap({chat, state("code", 3, false), state("aux", 3, true)}), wants("chat", 0), t0);
    CHECK_FALSE(has(q, action_kind::evict_device, "aux"));
  }

  TEST_CASE("cost-aware victim: of two equal candidates, the one with a host copy goes first") {
    auto r = roster();
    r.models[2].priority = 20;  // aux as important as chat
    // chat 6 GB not staged (reload from disk), aux 3 GB staged; code needs 4 GB of 10 with 9 used.
    auto s = snap({state("chat", 6, true, false), state("code", 3, false), state("aux", 3, true, true)});
    const double chat_score = policy::victim_score(r.models[0], s.models[0], s, t0);
    const double aux_score = policy::victim_score(r.models[2], s.models[2], s, t0);
    CHECK(aux_score < chat_score);
    const auto p = policy::plan_tandem(r, s, wants("code", 1), t0);
    CHECK(has(p, action_kind::evict_device, "aux"));
    CHECK_FALSE(has(p, action_kind::evict_device, "chat"));
    // Idle time discounts: an aux used just now scores higher than one idle for an hour.
    auto fresh = s.models[2];
    fresh.last_used = t0;
    auto stale = s.models[2];
    stale.last_used = t0 - 60min;
    CHECK(policy::victim_score(r.models[2], stale, s, t0) < policy::victim_score(r.models[2], fresh, s, t0));
  }

  TEST_CASE("priority preemption: a running lower-priority model is preempted when idle ones are not enough") {
    const auto r = roster();
    auto chat = state("chat", 6, true);
    chat.running = 1;
    chat.kv_device_bytes = 1000000000ull;
    auto s = snap({chat, state("code", 3, false), state("aux", 3, false)});  // 7 of 10 used; code needs 4
    const auto p = policy::plan_tandem(r, s, wants("code", 1), t0);
    CHECK(has(p, action_kind::preempt, "chat"));
    CHECK(has(p, action_kind::evict_device, "chat"));
    CHECK(has(p, action_kind::load, "code"));
    CHECK(p.run == "code");
    // The other way round, a lower-priority request never preempts a higher one (before
    // aging): it runs streamed beside it, in the part of the device left.
    auto code = state("code", 3, true);
    code.running = 1;
    code.kv_device_bytes = 1000000000ull;
    auto s2 = snap({state("chat", 6, false), code, state("aux", 3, true)});
    const auto p2 = policy::plan_tandem(r, s2, wants("chat", 1, t0), t0);
    CHECK_FALSE(has(p2, action_kind::preempt, "code"));
    CHECK(has(p2, action_kind::evict_device, "aux"));  // idle and lower: makes the room
    REQUIRE(has(p2, action_kind::load, "chat"));
    CHECK(p2.actions.back().bytes > 0);
    CHECK(p2.actions.back().bytes < 6000000000ull);
    CHECK(p2.run == "chat");  // its first token before code's next generated one
    auto no_stream = r;
    no_stream.policy.stream = false;
    const auto p3 = policy::plan_tandem(no_stream, s2, wants("chat", 1, t0), t0);
    CHECK_FALSE(has(p3, action_kind::load, "chat"));
    CHECK(p3.run == "code");
  }

  TEST_CASE("aging: after max_wait a waiting request outranks the whole roster") {
    const auto r = roster();
    const policy::model_demand d{"aux", 1, t0, 0};
    CHECK(policy::effective_priority(r, r.models[2], &d, t0) == doctest::Approx(10));
    CHECK(policy::effective_priority(r, r.models[2], &d, t0 + 5s) == doctest::Approx(10 + 0.5 * 81));
    CHECK(policy::effective_priority(r, r.models[2], &d, t0 + 10s) > 80);
    // code runs and keeps running; aux has waited 11 s: code is preempted for it.
    auto code = state("code", 3, true);
    code.running = 2;
    code.kv_device_bytes = 2000000000ull;
    auto chat = state("chat", 6, true);
    chat.last_used = t0;  // within policy.idle_grace: it does not give way
    auto s = snap({chat, code, state("aux", 3, false)});
    policy::demand dm;
    dm.models = {{"code", 3, t0 + 10s, 0}, {"aux", 1, t0, 0}};
    const auto early = policy::plan_tandem(r, s, dm, t0 + 1s);
    CHECK_FALSE(has(early, action_kind::load, "aux"));
    const auto late = policy::plan_tandem(r, s, dm, t0 + 11s);
    CHECK(has(late, action_kind::load, "aux"));
    CHECK(late.run == "aux");
  }

  TEST_CASE("aging serves a lower-priority model streamed, not by taking the device from a higher one mid-burst") {
    const auto r = roster();
    // code (priority 80) on the device, idle 2 s: between two requests of a burst. chat (20)
    // has waited 20 s, so it outranks code by effective priority.
    auto code = state("code", 3, true);
    code.last_used = t0 - 2s;
    auto s = snap({state("chat", 6, false), code, state("aux", 3, false)});
    s.device_capacity = 8000000000ull;  // chat (6 GB + 1 GB KV) and code do not fit together
    const auto p = policy::plan_tandem(r, s, wants("chat", 1, t0 - 20s), t0);
    CHECK_FALSE(has(p, action_kind::evict_device, "code"));
    REQUIRE(has(p, action_kind::load, "chat"));
    CHECK(p.actions.back().bytes > 0);  // in part, the rest streamed
    CHECK(p.run == "chat");             // served now all the same
    // Without streaming, aging has it take the device: the wait stays bounded.
    auto no_stream = r;
    no_stream.policy.stream = false;
    const auto p2 = policy::plan_tandem(no_stream, s, wants("chat", 1, t0 - 20s), t0);
    CHECK(has(p2, action_kind::evict_device, "code"));
    CHECK(has(p2, action_kind::load, "chat"));
  }

  TEST_CASE("a higher-priority model preempts a lower one that aging has raised above it, when that one can stream") {
    auto r = roster();
    r.models[0].max_sequences = 2;  // so that its waiting request can start, and ages
    // chat runs on the device and has another request waiting for 20 s (aged above code).
    auto chat = state("chat", 6, true);
    chat.running = 1;
    chat.kv_device_bytes = 1000000000ull;
    chat.last_used = t0;
    auto s = snap({chat, state("code", 3, false), state("aux", 3, false)});
    s.device_capacity = 8000000000ull;
    policy::demand d;
    d.models = {{"chat", 1, t0 - 20s, 0}, {"code", 1, t0, 0}};
    const auto p = policy::plan_tandem(r, s, d, t0);
    CHECK(has(p, action_kind::preempt, "chat"));
    CHECK(has(p, action_kind::load, "code"));
    CHECK(p.run == "code");
    // The next plan brings chat back in part beside it, streamed; its sequences resume, and it
    // is the one stepped (it aged).
    auto code = state("code", 3, true);
    code.running = 1;
    code.kv_device_bytes = 1000000000ull;
    code.loaded_at = t0;
    auto after = state("chat", 6, false);
    after.preempted = 1;
    auto s2 = snap({after, code, state("aux", 3, false)});
    s2.device_capacity = 8000000000ull;
    d.models[1].queued = 0;
    const auto next = policy::plan_tandem(r, s2, d, t0 + 10ms);
    CHECK_FALSE(has(next, action_kind::evict_device, "code"));
    REQUIRE(has(next, action_kind::load, "chat"));
    CHECK(next.actions.back().kind == action_kind::resume);
    CHECK(next.run == "chat");
    // Without streaming, chat's aged rank holds the device.
    auto no_stream = r;
    no_stream.policy.stream = false;
    const auto p2 = policy::plan_tandem(no_stream, s, d, t0);
    CHECK_FALSE(has(p2, action_kind::preempt, "chat"));
    CHECK_FALSE(has(p2, action_kind::load, "code"));
    CHECK(p2.run == "chat");
  }

  TEST_CASE("a model loaded by a plan is never also a victim in it") {
    // chat (aged past max_wait) and code both asked for, neither on the device, and they do
    // not fit together: chat is placed first (it outranks by age), so code runs... not by
    // evicting the chat load just queued: code streams or waits, chat runs.
    const auto r = roster();
    auto s = snap({state("chat", 7, false), state("code", 3, false), state("aux", 3, false)});
    policy::demand d;
    d.models = {{"chat", 1, t0 - 20s, 0}, {"code", 1, t0, 0}};
    const auto p = policy::plan_tandem(r, s, d, t0);
    CHECK(has(p, action_kind::load, "chat"));
    CHECK_FALSE(has(p, action_kind::evict_device, "chat"));
    CHECK(p.run == "chat");
  }

  TEST_CASE("may_interleave: higher base priority, tandem with interleave on, within max_wait") {
    auto r = roster();
    const auto& chat = r.models[0];
    const auto& code = r.models[1];
    CHECK(policy::may_interleave(r, chat, code, 0s));
    CHECK(policy::may_interleave(r, chat, code, 9s));
    CHECK_FALSE(policy::may_interleave(r, chat, code, 10s));  // the paused pass has waited max_wait
    CHECK_FALSE(policy::may_interleave(r, code, chat, 0s));   // never a lower one inside a higher one
    CHECK_FALSE(policy::may_interleave(r, chat, chat, 0s));
    r.policy.interleave = false;
    CHECK_FALSE(policy::may_interleave(r, r.models[0], r.models[1], 0s));
    r.policy.interleave = true;
    r.policy.name = "static";
    CHECK_FALSE(policy::may_interleave(r, r.models[0], r.models[1], 0s));
  }

  TEST_CASE("idle grace: an idle higher-priority model gives way once idle long enough") {
    const auto r = roster();  // idle_grace defaults to 30 s
    auto code = state("code", 3, true);
    auto s = snap({state("chat", 6, false), code, state("aux", 3, true)});
    s.device_capacity = 8000000000ull;
    // chat (priority 20) needs 7 GB of 8 with 6 used: aux (idle, lower) is not enough, code must go too.
    code.last_used = t0 - 5s;
    s.models[1] = code;
    auto p = policy::plan_tandem(r, s, wants("chat", 1), t0);
    CHECK_FALSE(has(p, action_kind::evict_device, "code"));  // idle only 5 s: between two requests of a burst
    REQUIRE(has(p, action_kind::load, "chat"));              // so chat runs streamed beside it
    CHECK(p.actions.back().bytes > 0);
    code.last_used = t0 - 40s;
    s.models[1] = code;
    p = policy::plan_tandem(r, s, wants("chat", 1), t0);
    CHECK(has(p, action_kind::evict_device, "code"));
    REQUIRE(has(p, action_kind::load, "chat"));
    CHECK(p.actions.back().bytes == 0);  // whole
  }

  TEST_CASE("pinned models are never evicted, and are loaded first") {
    const auto r = roster("    pinned: true\n");
    auto s = snap({state("chat", 6, true), state("code", 3, false), state("aux", 3, true)});
    // code (priority 80) needs 4 GB: aux goes, chat (pinned) never does.
    auto p = policy::plan_tandem(r, s, wants("code", 1), t0);
    CHECK_FALSE(has(p, action_kind::evict_device, "chat"));
    CHECK(has(p, action_kind::load, "code"));
    // A pinned model off the device comes back first, evicting whatever is needed.
    auto s2 = snap({state("chat", 6, false), state("code", 3, true), state("aux", 3, true)});
    p = policy::plan_tandem(r, s2, {}, t0);
    CHECK(has(p, action_kind::load, "chat"));
    CHECK(p.actions.front().kind == action_kind::evict_device);
  }

  TEST_CASE("keep-alive: an idle model leaves when its time runs out; -1 never, 0 at once") {
    auto r = roster();
    r.models[2].keep_alive = {false, 5min};
    auto aux = state("aux", 3, true);
    aux.last_used = t0 - 4min;
    auto p = policy::plan_tandem(r, snap({state("chat", 6, false), state("code", 3, false), aux}), {}, t0);
    CHECK_FALSE(has(p, action_kind::evict_device, "aux"));
    aux.last_used = t0 - 6min;
    p = policy::plan_tandem(r, snap({state("chat", 6, false), state("code", 3, false), aux}), {}, t0);
    CHECK(has(p, action_kind::evict_device, "aux"));
    r.models[2].keep_alive = {true, {}};
    p = policy::plan_tandem(r, snap({state("chat", 6, false), state("code", 3, false), aux}), {}, t0);
    CHECK_FALSE(has(p, action_kind::evict_device, "aux"));
    r.models[2].keep_alive = {false, 0ms};
    aux.last_used = t0;
    p = policy::plan_tandem(r, snap({state("chat", 6, false), state("code", 3, false), aux}), {}, t0);
    CHECK(has(p, action_kind::evict_device, "aux"));
    // Busy models are not expired.
    aux.running = 1;
    p = policy::plan_tandem(r, snap({state("chat", 6, false), state("code", 3, false), aux}), {}, t0);
    CHECK_FALSE(has(p, action_kind::evict_device, "aux"));
  }

  TEST_CASE("hysteresis: a model that just arrived is not evicted for one of the same priority") {
    auto r = roster();
    r.models[2].priority = 20;  // aux == chat
    // chat on the device (6 GB) since 1 s; aux (3 GB + 1 GB KV) asked for: 10 GB would be needed.
    auto chat = state("chat", 6, true);
    chat.loaded_at = t0 - 1s;
    chat.last_used = t0 - 1s;
    auto s = snap({chat, state("code", 3, true), state("aux", 3, false)});
    // aux's wait ages it above chat quickly; hysteresis still holds chat for 2 s.
    auto p = policy::plan_tandem(r, s, wants("aux", 1, t0 - 500ms), t0);
    CHECK_FALSE(has(p, action_kind::evict_device, "chat"));
    p = policy::plan_tandem(r, s, wants("aux", 1, t0 - 500ms), t0 + 1500ms);
    CHECK(has(p, action_kind::evict_device, "chat"));
    // A strictly more important model is not held back by it.
    auto s2 = snap({chat, state("code", 3, false), state("aux", 3, true)});
    p = policy::plan_tandem(r, s2, wants("code", 1), t0);
    CHECK(has(p, action_kind::load, "code"));
  }

  TEST_CASE("prefetch: when idle, the likeliest next model is staged, and loaded where it fits") {
    const auto r = roster();
    auto s = snap({state("chat", 6, false, false), state("code", 3, false, false), state("aux", 3, false, false)});
    policy::demand d;
    d.models = {{"chat", 0, {}, 0.01}, {"code", 0, {}, 0.5}, {"aux", 0, {}, 0.0}};
    const auto p = policy::plan_tandem(r, s, d, t0);
    CHECK(has(p, action_kind::stage, "code"));
    CHECK(has(p, action_kind::load, "code"));
    CHECK_FALSE(has(p, action_kind::stage, "chat"));
    // With demand anywhere, no prefetching.
    d.models[0].queued = 1;
    d.models[0].oldest = t0;
    const auto busy = policy::plan_tandem(r, s, d, t0);
    CHECK_FALSE(has(busy, action_kind::stage, "code"));
  }

  TEST_CASE("home: after another model's burst, the home model returns") {
    const auto r = roster("", "  home: chat\n");
    auto code = state("code", 3, true);
    auto aux = state("aux", 3, true);
    auto s = snap({state("chat", 6, false), code, aux});
    // 6 of 10 GB used; chat needs 7: one idle model must go.
    auto p = policy::plan_tandem(r, s, {}, t0);
    CHECK(has(p, action_kind::load, "chat"));
    CHECK(has(p, action_kind::evict_device, "aux"));
    // Not while code is busy, nor right after it was used.
    s.models[1].running = 1;
    p = policy::plan_tandem(r, s, {}, t0);
    CHECK_FALSE(has(p, action_kind::load, "chat"));
    s.models[1].running = 0;
    s.models[1].last_used = t0 - 1s;
    p = policy::plan_tandem(r, s, {}, t0);
    CHECK_FALSE(has(p, action_kind::load, "chat"));
  }

  TEST_CASE("preempted sequences resume when their model is back; plans are deterministic") {
    const auto r = roster();
    auto chat = state("chat", 6, true);
    chat.preempted = 1;
    auto s = snap({chat, state("code", 3, false), state("aux", 3, false)});
    const auto p = policy::plan_tandem(r, s, {}, t0);
    CHECK(has(p, action_kind::resume, "chat"));
    CHECK(p.run == "chat");
    const auto again = policy::plan_tandem(r, s, {}, t0);
    REQUIRE(again.actions.size() == p.actions.size());
    for (size_t i = 0; i < p.actions.size(); ++i) CHECK(again.actions[i].model == p.actions[i].model);
  }

  TEST_CASE("baselines: exclusive swaps everything, lru-keepalive needs a whole fit, static never swaps") {
    auto r = roster();
    auto s = snap({state("chat", 6, true), state("code", 3, false), state("aux", 3, true)});
    r.policy.name = "exclusive";
    auto p = policy::make_plan(r, s, wants("code", 1), t0);
    CHECK(has(p, action_kind::evict_device, "chat"));
    CHECK(has(p, action_kind::evict_device, "aux"));
    CHECK(has(p, action_kind::load, "code"));
    r.policy.name = "lru-keepalive";
    p = policy::make_plan(r, s, wants("code", 1), t0);  // code + 1 GB KV: one idle model must go
    CHECK(p.actions.size() == 2);
    CHECK(has(p, action_kind::load, "code"));
    r.policy.name = "static";
    auto empty = snap({state("chat", 6, false), state("code", 3, false), state("aux", 3, false)});
    p = policy::make_plan(r, empty, wants("aux", 1), t0);
    CHECK(has(p, action_kind::load, "code"));        // priority 80: 4 GB with its KV
    CHECK_FALSE(has(p, action_kind::load, "chat"));  // priority 20: 7 GB more would make 11 of 10
    CHECK(has(p, action_kind::load, "aux"));         // priority 10: 4 GB fits
  }

  TEST_CASE("drafts: brought with a busy target where room is free, dropped first under pressure, and when they do not pay") {
    // chat (6 GB) takes draft d (0.5 GB, 0.5 GB of KV a sequence), of a priority above code's:
    // only its being a draft without work of its own makes it give way.
    const auto r = roster(
        "    draft: d\n  - name: d\n    path: none\n    role: draft\n    priority: 90\n    size: 500MB\n    kv_bytes_per_token: 500KB\n"
        "    context: 1000\n    max_sequences: 1\n");
    auto chat = state("chat", 6, true);
    chat.running = 1;
    chat.kv_device_bytes = 1000000000ull;
    chat.last_used = t0;
    auto d = state("d", 0, false);
    d.weight_bytes = 500000000ull;
    d.last_used = t0;
    // 3 GB free: the draft comes with its target.
    auto p = policy::plan_tandem(r, snap({chat, state("code", 3, false), state("aux", 3, false), d}), {}, t0);
    CHECK(has(p, action_kind::load, "d"));
    CHECK(p.run == "chat");
    // Not when the target is idle, nor when it is measured not to pay (then it leaves).
    chat.running = 0;
    CHECK_FALSE(has(policy::plan_tandem(r, snap({chat, state("code", 3, false), state("aux", 3, false), d}), {}, t0), action_kind::load, "d"));
    chat.running = 1;
    policy::demand slow;
    slow.models.push_back({"chat", 0, {}, 0, 0.8});
    CHECK_FALSE(has(policy::plan_tandem(r, snap({chat, state("code", 3, false), state("aux", 3, false), d}), slow, t0), action_kind::load, "d"));
    d.on_device = true;
    p = policy::plan_tandem(r, snap({chat, state("code", 3, false), state("aux", 3, false), d}), slow, t0);
    CHECK(has(p, action_kind::evict_device, "d"));
    // Measured to pay: it stays.
    slow.models[0].draft_speedup = 1.6;
    CHECK(policy::plan_tandem(r, snap({chat, state("code", 3, false), state("aux", 3, false), d}), slow, t0).actions.empty());
    // code (3 GB + 1 GB of KV) asked for with 3.5 GB free: the draft goes first, chat stays.
    chat.running = 0;
    chat.kv_device_bytes = 0;
    chat.last_used = t0 - 1s;
    p = policy::plan_tandem(r, snap({chat, state("code", 3, false), state("aux", 3, false), d}), wants("code", 1), t0);
    CHECK(has(p, action_kind::evict_device, "d"));
    CHECK_FALSE(has(p, action_kind::evict_device, "chat"));
    CHECK(has(p, action_kind::load, "code"));
  }
}
