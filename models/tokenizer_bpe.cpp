#include "models/tokenizer_bpe.h"

#include <queue>

#include "models/unicode.h"

namespace tandem::models {
namespace {

struct symbol {
  int32_t id;    // token id of the symbol's text, -1 when the text is not a token
  int32_t prev;  // live chain, -1 at the ends
  int32_t next;
  bool alive;
};

struct bigram {
  int32_t rank;
  int32_t left;  // symbol indices
  int32_t right;
  int32_t left_id;  // ids when queued: a mismatch later means the pair is stale
  int32_t right_id;
  int32_t result;
};

// Lowest rank first; on equal ranks the leftmost pair.
struct bigram_order {
  bool operator()(const bigram& a, const bigram& b) const { return a.rank > b.rank || (a.rank == b.rank && a.left > b.left); }
};

}  // namespace

std::string byte_encode(std::string_view raw) {
  std::string out;
  out.reserve(raw.size() * 2);
  for (char c : raw) out += byte_to_unicode_utf8(static_cast<uint8_t>(c));
  return out;
}

std::string byte_decode(std::string_view encoded) {
  std::string out;
  out.reserve(encoded.size());
  for (size_t pos = 0; pos < encoded.size();) {
    const auto d = utf8_decode(encoded, pos);
    const int b = d.valid ? unicode_to_byte(d.cp) : -1;
    if (b >= 0)
      out += static_cast<char>(b);
    else
      out.append(encoded.substr(pos, d.len));
    pos += d.len;
  }
  return out;
}

bpe_tokenizer::bpe_tokenizer(const vocab& v, bool ignore_merges) : vocab_(v), ignore_merges_(ignore_merges) {
  const auto& list = v.merges();
  merges_.reserve(list.size());
  std::string joined;
  for (size_t k = 0; k < list.size(); ++k) {
    const std::string_view m = list[k];
    // Split at the first space after the first character, so a left part that is itself a
    // space (never the case in byte-level vocabularies) is still read correctly.
    const size_t sp = m.size() > 1 ? m.find(' ', 1) : std::string_view::npos;
    if (sp == std::string_view::npos || k > static_cast<size_t>(INT32_MAX)) {
      ++skipped_;
      continue;
    }
    const auto left = v.find(m.substr(0, sp));
    const auto right = v.find(m.substr(sp + 1));
    joined.assign(m.substr(0, sp));
    joined.append(m.substr(sp + 1));
    const auto result = v.find(joined);
    if (!left || !right || !result) {
      ++skipped_;
      continue;
    }
    merges_.try_emplace(key(*left, *right), merge{static_cast<int32_t>(k), *result});
  }
}

void bpe_tokenizer::encode_word(std::string_view raw_word, std::vector<int32_t>& out) const {
  if (raw_word.empty()) return;
  const std::string word = byte_encode(raw_word);
  if (ignore_merges_)
    if (const auto id = vocab_.find(word)) {
      out.push_back(*id);
      return;
    }

  std::vector<symbol> syms;
  syms.reserve(word.size() / 2 + 1);
  for (size_t pos = 0; pos < word.size();) {
    const size_t len = utf8_decode(word, pos).len;  // byte_encode produced valid UTF-8
    const auto id = vocab_.find(std::string_view(word).substr(pos, len));
    const auto i = static_cast<int32_t>(syms.size());
    syms.push_back({id ? *id : -1, i - 1, -1, true});
    if (i > 0) syms[static_cast<size_t>(i - 1)].next = i;
    pos += len;
  }

  std::priority_queue<bigram, std::vector<bigram>, bigram_order> queue;
  auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const int32_t l = syms[static_cast<size_t>(left)].id, r = syms[static_cast<size_t>(right)].id;
    if (l < 0 || r < 0) return;
    const auto it = merges_.find(key(l, r));
    if (it == merges_.end()) return;
    queue.push({it->second.rank, left, right, l, r, it->second.result});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(syms.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const bigram b = queue.top();
    queue.pop();
    auto& l = syms[static_cast<size_t>(b.left)];
    auto& r = syms[static_cast<size_t>(b.right)];
    // A symbol's id identifies its text (its start never moves), so unchanged ids on two
    // live neighbours mean the queued pair is still exactly this pair.
    if (!l.alive || !r.alive || l.next != b.right || l.id != b.left_id || r.id != b.right_id) continue;
    l.id = b.result;
    r.alive = false;
    l.next = r.next;
    if (r.next >= 0) syms[static_cast<size_t>(r.next)].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }

  for (int32_t i = 0; i >= 0; i = syms[static_cast<size_t>(i)].next) {
    const int32_t id = syms[static_cast<size_t>(i)].id;
    if (id >= 0)
      out.push_back(id);
    else if (vocab_.unk() >= 0)
      out.push_back(vocab_.unk());
  }
}

}  // namespace tandem::models
