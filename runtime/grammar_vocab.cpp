#include "runtime/grammar_vocab.h"

#include <algorithm>
#include <numeric>

#include "models/tokenizer.h"

namespace tandem::runtime {

grammar_vocab make_grammar_vocab(std::vector<std::string> pieces, std::vector<int32_t> eog) {
  grammar_vocab v;
  v.pieces = std::move(pieces);
  v.eog = std::move(eog);
  std::vector<int32_t> order;
  for (int32_t i = 0; i < v.n_vocab(); ++i) {
    const auto& p = v.pieces[static_cast<size_t>(i)];
    if (!p.empty() && p.size() <= k_grammar_max_piece) order.push_back(i);
  }
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const auto& pa = v.pieces[static_cast<size_t>(a)];
    const auto& pb = v.pieces[static_cast<size_t>(b)];
    return pa != pb ? pa < pb : a < b;
  });
  std::vector<uint32_t> path;  // node indices from the root's child down
  const std::string* prev = nullptr;
  auto pop_to = [&](size_t len) {
    while (path.size() > len) {
      v.end[path.back()] = static_cast<uint32_t>(v.byte.size());
      path.pop_back();
    }
  };
  for (const int32_t id : order) {
    const std::string& p = v.pieces[static_cast<size_t>(id)];
    size_t common = 0;
    if (prev)
      while (common < prev->size() && common < p.size() && (*prev)[common] == p[common]) ++common;
    pop_to(common);
    for (size_t i = common; i < p.size(); ++i) {
      path.push_back(static_cast<uint32_t>(v.byte.size()));
      v.byte.push_back(static_cast<uint8_t>(p[i]));
      v.depth.push_back(static_cast<uint16_t>(i + 1));
      v.end.push_back(0);
      v.tokens_at.push_back(static_cast<uint32_t>(v.token_ids.size()));
    }
    v.token_ids.push_back(id);
    v.max_depth = std::max(v.max_depth, p.size());
    prev = &p;
  }
  pop_to(0);
  v.tokens_at.push_back(static_cast<uint32_t>(v.token_ids.size()));
  return v;
}

std::shared_ptr<const grammar_vocab> make_grammar_vocab(const models::tokenizer& tok) {
  std::vector<std::string> pieces(static_cast<size_t>(tok.n_vocab()));
  std::vector<int32_t> eog;
  for (int32_t i = 0; i < tok.n_vocab(); ++i) {
    pieces[static_cast<size_t>(i)] = tok.token_to_piece(i, false);
    if (tok.is_eog(i)) {
      eog.push_back(i);
      pieces[static_cast<size_t>(i)].clear();
    }
  }
  return std::make_shared<const grammar_vocab>(make_grammar_vocab(std::move(pieces), std::move(eog)));
}

}  // namespace tandem::runtime
