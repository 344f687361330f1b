// Internal to the configs parsers: "1.5GiB", "30 m", "4096" split into the number and the unit
// text after it, for byte sizes and durations alike.
#pragma once

#include <optional>
#include <string_view>
#include <utility>

namespace tandem::configs::detail {

// The leading decimal number (digits with at most one point; no sign, no exponent) and what
// follows it, surrounding blanks removed; nullopt when there is no such number.
std::optional<std::pair<double, std::string_view>> split_number_unit(std::string_view text);

}  // namespace tandem::configs::detail
