// The cli module's spdlog logger, named "cli": one logger per module, so the log says
// which part of tandem spoke and its level can be set apart (spdlog::get("cli")).
#pragma once

#include <spdlog/logger.h>

namespace tandem::cli {

// Created on first use with the default logger's sinks and the global level. Thread-safe.
spdlog::logger& logger();

}  // namespace tandem::cli
