#include "models/tokenizer_spm.h"

#include <cstdio>
#include <queue>
#include <string>

#include "models/unicode.h"

namespace tandem::models {
namespace {

struct symbol {
  uint32_t start;  // byte offset in the text
  uint32_t len;    // 0 once merged into its left neighbour
  int32_t prev;    // neighbours in the live chain, -1 at the ends
  int32_t next;
};

struct bigram {
  float score;
  int32_t left;  // symbol indices
  int32_t right;
  uint32_t len;  // bytes of the merged text when queued: a later mismatch means stale
};

// Highest score first; on equal scores the leftmost pair.
struct bigram_order {
  bool operator()(const bigram& a, const bigram& b) const { return a.score < b.score || (a.score == b.score && a.left > b.left); }
};

}  // namespace

std::string spm_escape_whitespace(std::string_view text) {
  std::string out;
  out.reserve(text.size() + text.size() / 4);
  for (char c : text) {
    if (c == ' ')
      out += "\xE2\x96\x81";
    else
      out += c;
  }
  return out;
}

std::string spm_unescape_whitespace(std::string_view piece) {
  std::string out;
  out.reserve(piece.size());
  for (size_t k = 0; k < piece.size(); ++k) {
    if (piece.compare(k, 3, "\xE2\x96\x81") == 0) {
      out += ' ';
      k += 2;
    } else {
      out += piece[k];
    }
  }
  return out;
}

spm_tokenizer::spm_tokenizer(const vocab& v) : vocab_(v) {
  for (int b = 0; b < 256; ++b) {
    char hex[8];
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    auto id = v.find(hex);
    if (!id) id = v.find(std::string(1, static_cast<char>(b)));
    byte_ids_[static_cast<size_t>(b)] = id ? *id : v.unk();
  }
}

void spm_tokenizer::encode(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::vector<symbol> syms;
  syms.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    // Split as SentencePiece does: by lead byte, so invalid bytes stay single symbols and
    // fall back to their byte tokens without any replacement.
    const size_t len = std::min(utf8_lead_len(static_cast<uint8_t>(text[pos])), text.size() - pos);
    const auto i = static_cast<int32_t>(syms.size());
    syms.push_back({static_cast<uint32_t>(pos), static_cast<uint32_t>(len), i - 1, -1});
    if (i > 0) syms[static_cast<size_t>(i - 1)].next = i;
    pos += len;
  }

  std::priority_queue<bigram, std::vector<bigram>, bigram_order> queue;
  auto try_add = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const auto& l = syms[static_cast<size_t>(left)];
    const auto& r = syms[static_cast<size_t>(right)];
    const auto id = vocab_.find(text.substr(l.start, l.len + r.len));
    if (!id) return;
    queue.push({vocab_.score(*id), left, right, l.len + r.len});
  };
  for (int32_t i = 1; i < static_cast<int32_t>(syms.size()); ++i) try_add(i - 1, i);

  while (!queue.empty()) {
    const bigram b = queue.top();
    queue.pop();
    auto& l = syms[static_cast<size_t>(b.left)];
    auto& r = syms[static_cast<size_t>(b.right)];
    // Stale when either side was merged away or has grown since the pair was queued. The
    // left symbol's start never moves, so equal length means the same text.
    if (l.len == 0 || r.len == 0 || l.len + r.len != b.len || l.next != b.right) continue;
    l.len += r.len;
    r.len = 0;
    l.next = r.next;
    if (r.next >= 0) syms[static_cast<size_t>(r.next)].prev = b.left;
    try_add(l.prev, b.left);
    try_add(b.left, l.next);
  }

  for (int32_t i = 0; i >= 0; i = syms[static_cast<size_t>(i)].next) {
    const auto& s = syms[static_cast<size_t>(i)];
    const std::string_view piece = text.substr(s.start, s.len);
    if (const auto id = vocab_.find(piece)) {
      out.push_back(*id);
      continue;
    }
    for (char c : piece) {
      const int32_t id = byte_ids_[static_cast<uint8_t>(c)];
      if (id >= 0) out.push_back(id);  // a vocabulary with neither byte tokens nor <unk> drops the byte
    }
  }
}

}  // namespace tandem::models
