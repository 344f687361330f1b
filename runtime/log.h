// The runtime module's spdlog logger, named "runtime": one logger per module, so the log says
// which part of tandem spoke and its level can be set apart (spdlog::get("runtime")).
#pragma once

#include <spdlog/logger.h>

namespace tandem::runtime {

// Created on first use with the default logger's sinks and the global level. Thread-safe.
spdlog::logger& logger();

}  // namespace tandem::runtime
