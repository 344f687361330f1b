#include "api/log.h"

#include <spdlog/spdlog.h>

namespace tandem::api {

spdlog::logger& logger() {
  static const std::shared_ptr<spdlog::logger> logger = [] {
    if (auto existing = spdlog::get("api")) return existing;
    auto l = std::make_shared<spdlog::logger>("api", spdlog::default_logger()->sinks().begin(), spdlog::default_logger()->sinks().end());
    spdlog::initialize_logger(l);
    return l;
  }();
  return *logger;
}

}  // namespace tandem::api
