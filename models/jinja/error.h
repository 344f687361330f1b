// What parsing or rendering a chat template throws: the message names the line of the
// template (1-based; 0 where no line applies). `raised` is the template's own
// raise_exception(message): a refusal of the conversation, not a fault of the template.
#pragma once

#include <stdexcept>
#include <string>

namespace tandem::models::jinja {

struct error : std::runtime_error {
  int line = 0;
  error(const std::string& what, int at) : std::runtime_error(at > 0 ? "line " + std::to_string(at) + ": " + what : what), line(at) {}
};

struct raised : error {
  std::string message;  // as the template gave it
  explicit raised(const std::string& m) : error(m, 0), message(m) {}
};

}  // namespace tandem::models::jinja
