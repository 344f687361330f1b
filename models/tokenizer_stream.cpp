#include "models/tokenizer.h"

#include "models/unicode.h"

namespace tandem::models {

detokenizer_stream::detokenizer_stream(const tokenizer& t, bool render_special) : tok_(&t), render_special_(render_special) {}

std::string detokenizer_stream::push(int32_t id) {
  pending_ += tok_->token_to_piece(id, render_special_);
  // Emit everything up to an unfinished character at the end; what cannot become valid is
  // replaced now, so at most three bytes are ever held back.
  const size_t n = utf8_complete_prefix(pending_);
  std::string out = utf8_sanitize(std::string_view(pending_).substr(0, n));
  pending_.erase(0, n);
  return out;
}

std::string detokenizer_stream::flush() {
  std::string out = utf8_sanitize(pending_);
  pending_.clear();
  return out;
}

}  // namespace tandem::models
