#include "api/server_context.h"

#include "api/api_error.h"

namespace tandem::api {

server_context::server_context(runtime::served_roster& s, const configs::server_config& c) : served(s), config(c) {
  auto& m = metrics;
  m.declare("tandem_requests_total", "Generation requests by model, route and outcome (stop, length, cancelled, error, disconnected).",
            metric_type::counter);
  m.declare("tandem_prompt_tokens_total", "Prompt tokens of finished requests.", metric_type::counter);
  m.declare("tandem_generation_tokens_total", "Tokens generated for finished requests.", metric_type::counter);
  m.declare("tandem_time_to_first_token_seconds", "From the request's arrival to its first generated token.", metric_type::histogram,
            latency_buckets());
  m.declare("tandem_inter_token_latency_seconds", "Between consecutive generated tokens of a request.", metric_type::histogram, latency_buckets());
  m.declare("tandem_e2e_request_latency_seconds", "From the request's arrival to its end.", metric_type::histogram, latency_buckets());
  m.declare("tandem_queue_depth", "Requests waiting for a sequence slot.", metric_type::gauge);
  m.declare("tandem_running_sequences", "Sequences generating (preempted ones not counted).", metric_type::gauge);
  m.declare("tandem_preempted_sequences", "Sequences swapped out of the KV cache, waiting to resume.", metric_type::gauge);
  m.declare("tandem_kv_blocks_used", "KV cache blocks held by running sequences.", metric_type::gauge);
  m.declare("tandem_kv_blocks_cached", "KV cache blocks kept by the prefix cache (device tier).", metric_type::gauge);
  m.declare("tandem_kv_blocks_total", "Most KV cache blocks the model may hold (its limit).", metric_type::gauge);
  m.declare("tandem_kv_pages", "KV pages (one block each) the model holds on the device, from the pool all models share.", metric_type::gauge);
  m.declare("tandem_kv_bytes", "KV bytes of the model per memory tier (device pages; host: swapped-out sequences, spilled prefixes).",
            metric_type::gauge);
  m.declare("tandem_kv_usage_ratio", "Share of the device memory KV could have that KV pages hold (0..1).", metric_type::gauge);
  m.declare("tandem_kv_pages_moved_total", "KV pages copied between the device and the host, by direction (to_host, to_device).",
            metric_type::counter);
  m.declare("tandem_model_bytes", "Weight bytes of the model per memory tier (device, host).", metric_type::gauge);
  m.declare("tandem_model_on_device", "1 when the model can run now (its weights on the device, or streamed), else 0.", metric_type::gauge);
  m.declare("tandem_tier_bytes", "Bytes in use and capacity per memory tier.", metric_type::gauge);
  m.declare("tandem_prefix_cache_queries_total", "Admissions that looked up the prefix cache.", metric_type::counter);
  m.declare("tandem_prefix_cache_hits_total", "Admissions that reused cached prefix blocks.", metric_type::counter);
  m.declare("tandem_preemptions_total", "Sequences preempted (KV swapped out or dropped).", metric_type::counter);
  m.declare("tandem_spec_proposed_tokens_total", "Tokens proposed for verification (speculative decoding: n-gram, prediction, draft).",
            metric_type::counter);
  m.declare("tandem_spec_accepted_tokens_total", "Proposed tokens the model's own sampling kept.", metric_type::counter);
  m.declare("tandem_swap_ins_total", "Weight loads to the device.", metric_type::counter);
  m.declare("tandem_swap_in_bytes_total", "Weight bytes loaded to the device.", metric_type::counter);
  m.declare("tandem_swap_in_seconds_total", "Seconds weight loads took until every segment was resident.", metric_type::counter);
  m.declare("tandem_swap_outs_total", "Weight evictions from the device.", metric_type::counter);
  m.declare("tandem_swap_out_bytes_total", "Weight bytes evicted from the device.", metric_type::counter);
}

http_server_config http_config_of(const configs::server_config& s) {
  http_server_config hc;
  parse_listen(s.listen, &hc.host, &hc.port);
  hc.max_body_bytes = s.limits.max_body_bytes;
  hc.max_connections = s.limits.max_connections;
  hc.idle_timeout = s.limits.idle_timeout;
  hc.request_timeout = s.limits.request_timeout;
  return hc;
}

const runtime::served_model& resolve_model(server_context& ctx, std::string_view name) {
  if (const auto* m = ctx.served.find(name)) return *m;
  throw api_error(404, "invalid_request_error", "The model `" + std::string(name) + "` does not exist.", "model", "model_not_found");
}

}  // namespace tandem::api
