// A vocabulary as grammar matching sees it: each token's bytes, and a trie of them laid out in
// depth-first order, so a token mask is one forward walk that skips every subtree whose prefix
// the grammar rejects.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace tandem::models {
class tokenizer;
}

namespace tandem::runtime {

struct grammar_vocab {
  std::vector<std::string> pieces;  // per id: its bytes in text ("" for control tokens: never allowed)
  std::vector<int32_t> eog;         // end-of-generation ids: allowed where the grammar may end
  // The trie, node i in depth-first order: the byte on the edge into it, its depth (1 for a
  // first byte), the node after its subtree, and the tokens that end there
  // (token_ids[tokens_at[i] .. tokens_at[i + 1])).
  std::vector<uint8_t> byte;
  std::vector<uint16_t> depth;
  std::vector<uint32_t> end;
  std::vector<uint32_t> tokens_at;
  std::vector<int32_t> token_ids;
  size_t max_depth = 0;

  int32_t n_vocab() const { return static_cast<int32_t>(pieces.size()); }
};

// Tokens longer than this many bytes are left out of the trie (never allowed): no real
// vocabulary has one, and the walk keeps a state per byte of depth.
constexpr size_t k_grammar_max_piece = 1024;

grammar_vocab make_grammar_vocab(std::vector<std::string> pieces, std::vector<int32_t> eog);
// Pieces without special tokens' text (models::tokenizer::token_to_piece(id, false)); eog:
// the ids tokenizer::is_eog names.
std::shared_ptr<const grammar_vocab> make_grammar_vocab(const models::tokenizer& tok);

}  // namespace tandem::runtime
