#include "configs/duration.h"

#include "configs/number_unit.h"

#include <array>
#include <cmath>
#include <utility>

namespace tandem::configs {

std::optional<duration> parse_duration(std::string_view text) {
  const auto parts = detail::split_number_unit(text);
  if (!parts) return std::nullopt;
  const auto [number, unit] = *parts;
  static constexpr std::array<std::pair<std::string_view, double>, 7> k_units{{
      {"", 1000.0},
      {"ms", 1.0},
      {"s", 1000.0},
      {"m", 60e3},
      {"h", 3600e3},
      {"d", 86400e3},
      {"min", 60e3},
  }};
  double scale = 0;
  for (const auto& [name, s] : k_units)
    if (unit == name) scale = s;
  if (scale == 0) return std::nullopt;
  const double ms = number * scale;
  if (!std::isfinite(ms) || ms < 0 || ms > 100.0 * 365 * 86400e3) return std::nullopt;
  return duration(static_cast<int64_t>(std::llround(ms)));
}

std::string format_duration(duration d) {
  const int64_t ms = d.count();
  if (ms != 0 && ms % 3600000 == 0) return std::to_string(ms / 3600000) + "h";
  if (ms != 0 && ms % 60000 == 0) return std::to_string(ms / 60000) + "m";
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + "s";
  return std::to_string(ms) + "ms";
}

}  // namespace tandem::configs
