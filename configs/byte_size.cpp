#include "configs/byte_size.h"

#include <array>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <utility>

namespace tandem::configs {

std::optional<uint64_t> parse_byte_size(std::string_view text) {
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.front()))) text.remove_prefix(1);
  while (!text.empty() && std::isspace(static_cast<unsigned char>(text.back()))) text.remove_suffix(1);
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  if (i == 0) return std::nullopt;
  const std::string number(text.substr(0, i));
  if (number.find('.') != number.rfind('.') || number == ".") return std::nullopt;
  std::string_view unit = text.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.remove_prefix(1);
  static constexpr std::array<std::pair<std::string_view, double>, 15> k_units{{
      {"", 1.0},          {"B", 1.0},           {"K", 1024.0},       {"KiB", 1024.0},         {"kB", 1e3},
      {"KB", 1e3},        {"M", 1048576.0},     {"MiB", 1048576.0},  {"MB", 1e6},             {"G", 1073741824.0},
      {"GiB", 1073741824.0}, {"GB", 1e9},       {"T", 1099511627776.0}, {"TiB", 1099511627776.0}, {"TB", 1e12},
  }};
  double scale = 0;
  for (const auto& [name, s] : k_units)
    if (unit == name) scale = s;
  if (scale == 0) return std::nullopt;
  const double v = std::strtod(number.c_str(), nullptr) * scale;
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
  if (u == 0) std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  else std::snprintf(buf, sizeof buf, "%.1f %s", v, k_names[u]);
  return buf;
}

}  // namespace tandem::configs
