#include "configs/number_unit.h"

#include <cctype>
#include <cstdlib>
#include <string>

namespace tandem::configs::detail {

std::optional<std::pair<double, std::string_view>> split_number_unit(std::string_view text) {
  auto blank = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
  while (!text.empty() && blank(text.front())) text.remove_prefix(1);
  while (!text.empty() && blank(text.back())) text.remove_suffix(1);
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  const std::string number(text.substr(0, i));
  if (number.empty() || number == "." || number.find('.') != number.rfind('.')) return std::nullopt;
  std::string_view unit = text.substr(i);
  while (!unit.empty() && blank(unit.front())) unit.remove_prefix(1);
  return std::pair{std::strtod(number.c_str(), nullptr), unit};
}

}  // namespace tandem::configs::detail
