#include "api/indent_gate.h"

namespace tandem::api {

std::string indent_gate::pass(std::string_view text) {
  if (min_ <= 0) return std::string(text);
  std::string out;
  for (const char c : text) {
    if (closed_) break;
    if (!at_line_start_) {
      out += c;
      at_line_start_ = c == '\n';
    } else if (c == ' ' || c == '\t') {
      held_ += c;
    } else if (c == '\n') {
      out += held_;
      out += c;
      held_.clear();
    } else if (static_cast<int64_t>(held_.size()) < min_) {
      closed_ = true;
      held_.clear();
    } else {
      out += held_;
      out += c;
      held_.clear();
      at_line_start_ = false;
    }
  }
  return out;
}

}  // namespace tandem::api
