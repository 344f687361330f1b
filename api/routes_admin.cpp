// The operator's routes: every model's residency and queues (GET /admin/models), moving a
// model on or off the device, pinning it, and changing its priority or keep-alive.
#include <nlohmann/json.hpp>

#include "api/api_error.h"
#include "api/generation.h"
#include "api/json_body.h"
#include "api/model_state.h"
#include "api/ollama_request.h"
#include "api/routes.h"
#include "configs/duration.h"

namespace tandem::api {

using nlohmann::json;

namespace {

json keep_alive_json(const configs::keep_alive_setting& k) {
  if (k.forever) return -1;
  return configs::format_duration(k.after);
}

json admin_model(server_context& ctx, const runtime::served_model& m, const memory::arbiter_snapshot& snap) {
  const auto st = ctx.served.executor().stats(m.name());
  const auto res = residency_of(snap, m.name());
  json expiry = nullptr;
  if (!st.pinned && !st.keep_alive.forever && res.device_bytes > 0) {
    const auto left =
        std::chrono::duration_cast<std::chrono::system_clock::duration>(st.keep_alive.after - (std::chrono::steady_clock::now() - st.last_used));
    expiry = rfc3339(std::chrono::system_clock::now() + left);
  }
  return json{
      {"name", m.name()},
      {"aliases", m.entry->aliases},
      {"file", m.entry->file},
      {"role", configs::role_name(m.entry->role)},
      {"state", res.state},
      {"ready", res.runnable},
      {"bytes",
       {{"weights", res.weight_bytes},
        {"device", res.device_bytes},
        {"host", res.host_bytes},
        {"kv_device", res.kv_device_bytes},
        {"kv_host", res.kv_host_bytes}}},
      {"segments", {{"total", res.segments}, {"on_device", res.on_device}, {"landing", res.landing}}},
      {"stream_slots", res.stream_slots},
      {"leases", res.leases},
      {"queue_depth", st.queued},
      {"running", st.running},
      {"preempted", st.preempted},
      {"kv_blocks",
       {{"used", st.kv_blocks_used}, {"cached", st.kv_blocks_cached}, {"cached_on_host", st.kv_blocks_cached_host}, {"total", st.kv_blocks_total}}},
      {"kv_pages",
       {{"on_device", st.kv_blocks_device},
        {"floor", st.kv_blocks_floor},
        {"limit", st.kv_blocks_total},
        {"page_bytes", st.kv_block_bytes},
        {"moved_to_host", st.kv_blocks_moved_to_host},
        {"moved_to_device", st.kv_blocks_moved_to_device}}},
      {"priority", st.priority},
      {"pinned", st.pinned},
      {"keep_alive", keep_alive_json(st.keep_alive)},
      {"keep_alive_expires_at", expiry},
      {"swap_ins", st.swap_ins},
      {"swap_outs", st.swap_outs},
      {"last_swap_in_seconds", st.last_swap_in_seconds},
      {"preemptions", st.preemptions},
      {"speculation",
       {{"method", configs::speculate_method_name(m.entry->speculate.method)},
        {"max_tokens", m.entry->speculate.max_tokens},
        {"ngram_cache", m.entry->speculate.cache},
        {"draft", st.draft.empty() ? json(nullptr) : json(st.draft)},
        {"proposed", st.spec_proposed},
        {"accepted", st.spec_accepted},
        {"acceptance_rate",
         st.spec_proposed > 0 ? json(static_cast<double>(st.spec_accepted) / static_cast<double>(st.spec_proposed)) : json(nullptr)},
        {"verifying_passes", st.spec_passes},
        {"tokens_per_pass", st.spec_passes > 0 ? json(static_cast<double>(st.spec_tokens) / static_cast<double>(st.spec_passes)) : json(nullptr)},
        {"draft_seconds", st.draft_seconds},
        {"draft_speedup", st.draft_speedup > 0 ? json(st.draft_speedup) : json(nullptr)}}}};
}

http_response ok_json(const json& j) {
  http_response r;
  r.body = j.dump();
  return r;
}

}  // namespace

route_result handle_admin_models(server_context& ctx, const http_request&) {
  const auto snap = ctx.served.arbiter().snapshot();
  json models = json::array();
  for (const auto& m : ctx.served.models()) models.push_back(admin_model(ctx, *m, snap));
  return ok_json({{"device", {{"backend", ctx.served.backend().info().name}, {"capacity", snap.device.capacity}, {"used", snap.device.used}}},
                  {"host", {{"capacity", snap.host.capacity}, {"used", snap.host.used}}},
                  {"models", models}});
}

route_result handle_admin_action(server_context& ctx, const http_request&, const std::string& name, const std::string& action) {
  const auto& m = resolve_model(ctx, name);
  auto& e = ctx.served.executor();
  runtime::model_control c;
  if (action == "load") {
    c.load = true;
  } else if (action == "evict") {
    if (e.stats(m.name()).pinned) throw api_error(409, "invalid_request_error", "model '" + m.name() + "' is pinned; unpin it before evicting it");
    c.evict = true;
  } else if (action == "pin") {
    c.pinned = true;
  } else if (action == "unpin") {
    c.pinned = false;
  } else {
    throw api_error(404, "invalid_request_error", "no admin action '" + action + "'; use load, evict, pin or unpin", {}, "unknown_url");
  }
  e.control(m.name(), c);
  // The engine applies it before its next plan; the listing shows the result from then on.
  return ok_json({{"model", m.name()}, {"action", action}, {"accepted", true}});
}

route_result handle_admin_patch(server_context& ctx, const http_request& r, const std::string& name) {
  const auto& m = resolve_model(ctx, name);
  const json body = parse_json_object(r);
  runtime::model_control c;
  for (const auto& [k, v] : body.items()) {
    if (k == "priority") {
      if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > 1000)
        throw bad_request("priority must be an integer from 0 to 1000", "priority");
      c.priority = v.get<int>();
    } else if (k == "keep_alive") {
      const auto ka = parse_keep_alive(v);
      if (!ka) throw bad_request("keep_alive must be a duration (\"10m\"), seconds, or -1 for ever", "keep_alive");
      c.keep_alive = configs::keep_alive_setting{ka->forever, std::chrono::duration_cast<configs::duration>(ka->after)};
    } else if (k == "pinned") {
      if (!v.is_boolean()) throw bad_request("pinned must be true or false", "pinned");
      c.pinned = v.get<bool>();
    } else {
      throw bad_request("unknown field '" + k + "'; PATCH takes priority, keep_alive and pinned", k);
    }
  }
  ctx.served.executor().control(m.name(), c);
  return ok_json({{"model", m.name()}, {"accepted", true}});
}

}  // namespace tandem::api
