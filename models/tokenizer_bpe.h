// Byte-level BPE (tokenizer.ggml.model "gpt2"): words from the pre-tokenizer are mapped
// byte-by-byte onto GPT-2's printable alphabet, then merged pairwise by merge rank.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "models/vocab.h"

namespace tandem::models {

class bpe_tokenizer {
 public:
  // Builds the merge table from v.merges(): entry k ("left right") has rank k. A merge whose
  // left, right or joined text is not a token is skipped (a hostile or damaged file cannot
  // make encoding fail); when a pair repeats, its first rank counts.
  bpe_tokenizer(const vocab& v, bool ignore_merges);

  size_t merge_count() const { return merges_.size(); }
  size_t skipped_merges() const { return skipped_; }

  // Appends the ids of one pre-tokenized word given as raw bytes. With ignore_merges, a word
  // that is itself a token is emitted whole. Otherwise merges are applied lowest rank
  // first (leftmost on ties) until none applies. A character missing from the vocabulary
  // becomes the unknown token, or is dropped when there is none.
  void encode_word(std::string_view raw_word, std::vector<int32_t>& out) const;

 private:
  struct merge {
    int32_t rank;
    int32_t result;
  };
  static uint64_t key(int32_t left, int32_t right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
  }

  const vocab& vocab_;
  bool ignore_merges_;
  std::unordered_map<uint64_t, merge> merges_;
  size_t skipped_ = 0;
};

// The word's bytes spelled in GPT-2's byte-level alphabet (how BPE vocabularies store text).
std::string byte_encode(std::string_view raw);
// Inverse of byte_encode for a token's text; code points outside the alphabet are kept as
// their UTF-8 (some vocabularies hold a few literal characters).
std::string byte_decode(std::string_view encoded);

}  // namespace tandem::models
