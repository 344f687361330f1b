// A generation's text as it becomes final: the complete UTF-8 of its tokens
// (models::detokenizer_stream), less any tail that may still turn out to be the start of a
// stop string. When a stop string completes, the text before it is the last released and the
// generation ends; the stop string itself is never released (OpenAI's and llama.cpp's
// behaviour).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/tokenizer.h"

namespace tandem::runtime {

class text_stream {
 public:
  // The tokenizer must outlive the stream. Empty stop strings are ignored.
  text_stream(const models::tokenizer& t, std::vector<std::string> stops);

  struct step {
    std::string text;      // released now (may be empty while text is held back)
    bool stopped = false;  // a stop string completed: `text` ends where it began
  };
  step push(int32_t id);
  // The end of a generation that no stop string ended: whatever is still held back.
  std::string flush();
  // Bytes held back because they may begin a stop string (or end mid-character).
  size_t held_bytes() const { return held_.size() + detok_.pending_bytes(); }

 private:
  step release(bool at_end);

  models::detokenizer_stream detok_;
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace tandem::runtime
