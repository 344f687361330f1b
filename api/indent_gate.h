// llama.cpp's n_indent for /infill: a generated line indented by fewer whitespace characters
// (spaces and tabs) than the minimum ends the completion, without that line. A line's leading
// whitespace is held back until its first other character shows whether the line may stay;
// the cursor's own line (the first) is exempt, and blank lines pass.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace tandem::api {

class indent_gate {
 public:
  explicit indent_gate(int64_t min_indent = 0) : min_(min_indent) {}
  // The part of `text` that may go to the client; once closed, nothing more.
  std::string pass(std::string_view text);
  bool closed() const { return closed_; }

 private:
  int64_t min_;
  bool at_line_start_ = false;
  bool closed_ = false;
  std::string held_;  // the current line's leading whitespace
};

}  // namespace tandem::api
