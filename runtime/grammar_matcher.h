// Where a generation stands in a grammar, and which tokens may come next.
//
// A parse position is a stack of grammar positions; the state is the set of stacks the bytes
// so far allow (a pushdown automaton run on all its branches at once). States are interned as
// they are met and each (state, byte) transition is computed once, so the matcher grows into a
// DFA over the states this generation visits; a state's token mask is one walk of the
// vocabulary trie over that DFA (grammar_vocab.h) and is kept, so a state seen again (every
// character inside a JSON string, say) costs only applying its mask.
//
// Not thread-safe: one sequence's matcher is used by one thread at a time. The grammar and
// vocabulary are shared and immutable.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "runtime/grammar.h"
#include "runtime/grammar_vocab.h"

namespace tandem::runtime {

// Bounds that keep an ambiguous or deeply nested parse finite: stacks past the depth and
// states past the branch count are dropped (what is kept is still a valid parse, so every
// output stays in the language; only some continuations are refused).
constexpr size_t k_grammar_max_stack = 2048;
constexpr size_t k_grammar_max_branches = 1024;

class grammar_matcher {
 public:
  grammar_matcher(std::shared_ptr<const grammar> g, std::shared_ptr<const grammar_vocab> v);

  // Sets every logit whose token may not come next to -inf (ids past the vocabulary too).
  // End-of-generation tokens may come where the grammar may end. Returns false when no token
  // may (the grammar needs bytes no token of this vocabulary spells from here).
  bool mask(std::span<float> logits);
  // The allowed tokens as a bitset over the vocabulary (bit i of word i / 64).
  const std::vector<uint64_t>& allowed();
  // Moves past a token; false (nothing changed) when the grammar does not allow it here. An
  // end-of-generation token is allowed where the grammar may end and changes nothing.
  bool accept(int32_t token);
  bool accept_bytes(std::string_view bytes);
  bool accepting() const;  // the bytes so far are a whole sentence of the grammar
  bool finished() const;   // accepting, and nothing may follow
  size_t states() const { return nodes_.size(); }

 private:
  struct node {
    std::vector<uint32_t> config;  // the stacks, flattened: [size, positions...] each, sorted
    std::array<int32_t, 256> next;
    bool accepting = false;
    bool open = false;  // some stack still expects bytes
    std::vector<uint64_t> mask;
  };
  struct config_hash {
    size_t operator()(const std::vector<uint32_t>& c) const noexcept;
  };

  int32_t intern(std::vector<uint32_t> config);
  int32_t step(int32_t from, uint8_t byte);
  int32_t compute_step(int32_t from, uint8_t byte);
  void closure(std::vector<uint32_t> stack, std::vector<std::vector<uint32_t>>& out);
  int32_t from_stacks(std::vector<std::vector<uint32_t>>& stacks);
  void compute_mask(int32_t n);
  void bound();  // between tokens: forgets the DFA (keeping the state) when it has grown too big

  std::shared_ptr<const grammar> g_;
  std::shared_ptr<const grammar_vocab> v_;
  std::vector<node> nodes_;
  std::unordered_map<std::vector<uint32_t>, int32_t, config_hash> index_;
  int32_t current_ = 0;
  size_t masks_ = 0;
  std::vector<int32_t> walk_;  // the trie walk's state per depth
  size_t work_ = 0;            // stacks expanded for the mask or token at hand (bounded)
};

}  // namespace tandem::runtime
