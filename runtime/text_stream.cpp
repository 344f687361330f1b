#include "runtime/text_stream.h"

#include <algorithm>

namespace tandem::runtime {

text_stream::text_stream(const models::tokenizer& t, std::vector<std::string> stops) : detok_(t) {
  for (auto& s : stops)
    if (!s.empty()) stops_.push_back(std::move(s));
}

text_stream::step text_stream::push(int32_t id) {
  if (stopped_) return {};
  held_ += detok_.push(id);
  return release(false);
}

std::string text_stream::flush() {
  if (stopped_) return {};
  held_ += detok_.flush();
  return release(true).text;
}

text_stream::step text_stream::release(bool at_end) {
  step out;
  // Everything released so far was checked to start no stop string, so a match lies wholly in
  // what is held. The earliest one ends the text.
  size_t first = std::string::npos;
  for (const auto& s : stops_) first = std::min(first, held_.find(s));
  if (first != std::string::npos) {
    out.text = held_.substr(0, first);
    out.stopped = true;
    stopped_ = true;
    held_.clear();
    return out;
  }
  // Hold back the longest tail that is a proper prefix of some stop string.
  size_t hold = 0;
  if (!at_end)
    for (const auto& s : stops_)
      for (size_t k = std::min(s.size() - 1, held_.size()); k > hold; --k)
        if (held_.compare(held_.size() - k, k, s, 0, k) == 0) {
          hold = k;
          break;
        }
  out.text = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return out;
}

}  // namespace tandem::runtime
