// Reads a `tandem sim` trace (trace.h) from YAML. Errors are config_errors naming file, line,
// column and key, as the roster's; model names are checked against the roster.
#pragma once

#include <string>
#include <string_view>

#include "configs/roster.h"
#include "configs/roster_loader.h"
#include "configs/trace.h"

namespace tandem::configs {

trace_spec load_trace(const std::string& path, const roster& r);
trace_spec parse_trace(std::string_view yaml, const std::string& source, const roster& r);

}  // namespace tandem::configs
