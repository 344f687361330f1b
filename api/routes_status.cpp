// GET /health and GET /metrics.
#include <nlohmann/json.hpp>

#include "api/api_error.h"
#include "api/model_state.h"
#include "api/routes.h"

namespace tandem::api {

route_result handle_health(server_context& ctx, const http_request&) {
  if (!ctx.served.ready()) {
    api_error e(503, "unavailable_error", "Loading model");
    e.retry_after_s = 1;
    throw e;
  }
  http_response r;
  r.body = R"({"status":"ok"})";
  return r;
}

route_result handle_metrics(server_context& ctx, const http_request&) {
  auto& m = ctx.metrics;
  const auto snap = ctx.served.arbiter().snapshot();
  {
    std::lock_guard lock(ctx.scrape_m);
    // Counters kept by the engine as totals: add what they grew by since the last scrape.
    auto grow = [&](const char* name, const std::string& model, double total) {
      double& last = ctx.scraped[std::string(name) + "\n" + model];
      if (total > last) m.add(name, {{"model", model}}, total - last);
      last = std::max(last, total);
    };
    for (const auto& sm : ctx.served.models()) {
      const std::string& name = sm->name();
      const auto st = ctx.served.executor().stats(name);
      const labels l{{"model", name}};
      m.set("tandem_queue_depth", l, st.queued);
      m.set("tandem_running_sequences", l, st.running);
      m.set("tandem_preempted_sequences", l, st.preempted);
      m.set("tandem_kv_blocks_used", l, st.kv_blocks_used);
      m.set("tandem_kv_blocks_cached", l, st.kv_blocks_cached);
      m.set("tandem_kv_blocks_total", l, st.kv_blocks_total);
      m.set("tandem_kv_pages", l, st.kv_blocks_device);
      const auto res = residency_of(snap, name);
      m.set("tandem_kv_bytes", {{"model", name}, {"tier", "device"}}, static_cast<double>(res.kv_device_bytes));
      m.set("tandem_kv_bytes", {{"model", name}, {"tier", "host"}}, static_cast<double>(res.kv_host_bytes));
      m.set("tandem_model_bytes", {{"model", name}, {"tier", "device"}}, static_cast<double>(res.device_bytes));
      m.set("tandem_model_bytes", {{"model", name}, {"tier", "host"}}, static_cast<double>(res.host_bytes));
      m.set("tandem_model_on_device", l, res.runnable ? 1 : 0);
      grow("tandem_prefix_cache_queries_total", name, static_cast<double>(st.prefix_queries));
      grow("tandem_prefix_cache_hits_total", name, static_cast<double>(st.prefix_hits));
      grow("tandem_preemptions_total", name, static_cast<double>(st.preemptions));
      grow("tandem_spec_proposed_tokens_total", name, static_cast<double>(st.spec_proposed));
      grow("tandem_spec_accepted_tokens_total", name, static_cast<double>(st.spec_accepted));
      grow("tandem_swap_ins_total", name, static_cast<double>(st.swap_ins));
      grow("tandem_swap_in_bytes_total", name, static_cast<double>(st.swap_in_bytes));
      grow("tandem_swap_in_seconds_total", name, st.swap_in_seconds);
      grow("tandem_swap_outs_total", name, static_cast<double>(st.swap_outs));
      grow("tandem_swap_out_bytes_total", name, static_cast<double>(st.swap_out_bytes));
      for (const auto& [dir, total] : {std::pair{"to_host", st.kv_blocks_moved_to_host}, std::pair{"to_device", st.kv_blocks_moved_to_device}}) {
        double& last = ctx.scraped[std::string("tandem_kv_pages_moved_total\n") + name + "\n" + dir];
        const auto t = static_cast<double>(total);
        if (t > last) m.add("tandem_kv_pages_moved_total", {{"model", name}, {"direction", dir}}, t - last);
        last = std::max(last, t);
      }
    }
    m.set("tandem_kv_usage_ratio", {}, kv_usage_ratio(snap));
    m.set("tandem_tier_bytes", {{"tier", "device"}, {"kind", "used"}}, static_cast<double>(snap.device.used));
    m.set("tandem_tier_bytes", {{"tier", "device"}, {"kind", "capacity"}}, static_cast<double>(snap.device.capacity));
    m.set("tandem_tier_bytes", {{"tier", "host"}, {"kind", "used"}}, static_cast<double>(snap.host.used));
    m.set("tandem_tier_bytes", {{"tier", "host"}, {"kind", "capacity"}}, static_cast<double>(snap.host.capacity));
  }
  http_response r;
  r.content_type = "text/plain; version=0.0.4; charset=utf-8";
  r.body = m.render();
  return r;
}

}  // namespace tandem::api
