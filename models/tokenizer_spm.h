// SentencePiece-style tokenization (tokenizer.ggml.model "llama"): greedy merges of adjacent
// pieces by token score, with byte fallback for text no token covers.
#pragma once

#include <array>
#include <cstdint>
#include <string_view>
#include <vector>

#include "models/vocab.h"

namespace tandem::models {

class spm_tokenizer {
 public:
  // Looks up the byte tokens <0x00>..<0xFF> once.
  explicit spm_tokenizer(const vocab& v);

  // Appends the ids of `text`, which must already be escaped (spaces as U+2581, and the
  // space prefix added when the vocabulary wants one). Starting from single UTF-8
  // characters, repeatedly merges the adjacent pair whose concatenation is the
  // highest-scoring token (leftmost on ties); a final piece that is not a token becomes
  // its bytes' <0xNN> tokens (or the unknown token when a byte token is missing).
  // O(n log n) in the length of text.
  void encode(std::string_view text, std::vector<int32_t>& out) const;

  // Token for one raw byte: <0xNN>, else the one-byte text, else unknown, else -1.
  int32_t byte_token(uint8_t b) const { return byte_ids_[b]; }

 private:
  const vocab& vocab_;
  std::array<int32_t, 256> byte_ids_{};
};

// " " -> U+2581, as SentencePiece stores spaces in its pieces, and back.
std::string spm_escape_whitespace(std::string_view text);
std::string spm_unescape_whitespace(std::string_view piece);

}  // namespace tandem::models
