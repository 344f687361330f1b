#include "configs/byte_size.h"

#include "configs/number_unit.h"

#include <array>
#include <cmath>
#include <cstdio>
#include <utility>

namespace tandem::configs {

std::optional<uint64_t> parse_byte_size(std::string_view text) {
  const auto parts = detail::split_number_unit(text);
  if (!parts) return std::nullopt;
  const auto [number, unit] = *parts;
  static constexpr std::array<std::pair<std::string_view, double>, 15> k_units{{
      {"", 1.0},
      {"B", 1.0},
      {"K", 1024.0},
      {"KiB", 1024.0},
      {"kB", 1e3},
      {"KB", 1e3},
      {"M", 1048576.0},
      {"MiB", 1048576.0},
      {"MB", 1e6},
      {"G", 1073741824.0},
      {"GiB", 1073741824.0},
      {"GB", 1e9},
      {"T", 1099511627776.0},
      {"TiB", 1099511627776.0},
      {"TB", 1e12},
  }};
  double scale = 0;
  for (const auto& [name, s] : k_units)
    if (unit == name) scale = s;
  if (scale == 0) return std::nullopt;
  const double v = number * scale;
  if (!std::isfinite(v) || v < 0 || v >= 18446744073709551615.0) return std::nullopt;
  return static_cast<uint64_t>(std::llround(v));
}

std::string format_byte_size(uint64_t bytes) {
  static constexpr std::array<const char*, 5> k_names{"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  size_t u = 0;
  while (v >= 1024.0 && u + 1 < k_names.size()) {
    v /= 1024.0;
    ++u;
  }
  char buf[48];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, k_names[u]);
  return buf;
}

}  // namespace tandem::configs
