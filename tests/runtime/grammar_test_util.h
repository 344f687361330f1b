// The grammar tests' vocabulary of the 256 single bytes, so a matcher can be fed any byte string.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "runtime/grammar_vocab.h"

namespace tandem::test {

inline std::shared_ptr<const runtime::grammar_vocab> byte_vocab() {
  static const auto v = [] {
    std::vector<std::string> pieces;
    for (int b = 0; b < 256; ++b) pieces.emplace_back(1, static_cast<char>(b));
    return std::make_shared<const runtime::grammar_vocab>(runtime::make_grammar_vocab(std::move(pieces), {}));
  }();
  return v;
}

}  // namespace tandem::test
