// Durations as people write them in rosters and flags: "500ms", "45s", "30m", "2h", "1d", a bare
// number of seconds ("300", "1.5"), and for keep-alive "-1" (never expires).
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

namespace tandem::configs {

using duration = std::chrono::milliseconds;

// nullopt for anything else: empty, negative, an unknown unit, more than 100 years.
std::optional<duration> parse_duration(std::string_view text);
// "500ms", "45s", "30m", "2h": the largest unit that divides it exactly.
std::string format_duration(duration d);

}  // namespace tandem::configs
