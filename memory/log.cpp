#include "memory/log.h"

#include <spdlog/spdlog.h>

namespace tandem::memory {

spdlog::logger& logger() {
  static const std::shared_ptr<spdlog::logger> logger = [] {
    if (auto existing = spdlog::get("memory")) return existing;
    auto l = std::make_shared<spdlog::logger>("memory", spdlog::default_logger()->sinks().begin(), spdlog::default_logger()->sinks().end());
    spdlog::initialize_logger(l);
    return l;
  }();
  return *logger;
}

}  // namespace tandem::memory
