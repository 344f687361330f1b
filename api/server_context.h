// What every route reads: the served roster (models, engine, arbiter), the server's
// configuration (keys, limits) and the metrics registry. Routes are free functions of it.
#pragma once

#include <chrono>
#include <map>
#include <mutex>
#include <string>
#include <string_view>

#include "api/http_server.h"
#include "api/prometheus.h"
#include "configs/roster.h"
#include "runtime/served_roster.h"

namespace tandem::api {

struct server_context {
  runtime::served_roster& served;
  configs::server_config config;
  metrics_registry metrics;
  std::chrono::system_clock::time_point started = std::chrono::system_clock::now();
  // The engine's running totals last added to the metrics' counters (handle_metrics adds the
  // difference at each scrape).
  std::mutex scrape_m;
  std::map<std::string, double> scraped;

  server_context(runtime::served_roster& s, const configs::server_config& c);
};

// The HTTP server's settings from the roster's server section (listen address and limits).
// Throws std::invalid_argument for a bad listen address.
http_server_config http_config_of(const configs::server_config& s);

// The model a request names (by name or alias): throws api_error 404 model_not_found.
const runtime::served_model& resolve_model(server_context& ctx, std::string_view name);

}  // namespace tandem::api
