#include "runtime/draft_mirror.h"

#include <algorithm>

#include "models/unicode.h"

namespace tandem::runtime {

namespace {

// A draft token's share of the text: control tokens (its BOS) spell nothing.
std::string draft_piece(const draft_vocab& v, int32_t id) { return v.draft->token_to_piece(id, false); }

void render_history(draft_mirror& m, const draft_vocab& v, std::span<const int32_t> history) {
  for (; m.text_tokens < history.size(); ++m.text_tokens) m.text += v.target->token_to_piece(history[m.text_tokens], true);
}

}  // namespace

bool same_vocabulary(const models::tokenizer& a, const models::tokenizer& b) {
  const auto& va = a.vocabulary();
  const auto& vb = b.vocabulary();
  if (va.size() != vb.size() || a.type_name() != b.type_name()) return false;
  for (int32_t id = 0; id < va.size(); ++id)
    if (va.text(id) != vb.text(id)) return false;
  return true;
}

void start_mirror(draft_mirror& m, const draft_vocab& v) {
  m.fed.clear();
  m.base = 0;
  m.text.clear();
  m.text_tokens = 0;
  m.covered = 0;
  if (v.draft && v.draft->add_bos() && v.draft->bos() >= 0) m.fed.push_back(v.draft->bos());
  m.base = m.fed.size();
}

bool catch_up(draft_mirror& m, const draft_vocab& v, std::span<const int32_t> history, int64_t max, std::vector<int32_t>& out) {
  if (history.empty() || max <= 0) return false;
  if (!v.draft) {
    // The last token must be fed again when the draft has seen everything (its logits were
    // not kept): the proposals continue from its row.
    if (m.fed.size() >= history.size()) m.fed.resize(history.size() - 1);
    m.base = m.fed.size();
    const size_t n = std::min(history.size() - m.fed.size(), static_cast<size_t>(max));
    out.insert(out.end(), history.begin() + static_cast<std::ptrdiff_t>(m.fed.size()),
               history.begin() + static_cast<std::ptrdiff_t>(m.fed.size() + n));
    return m.fed.size() + n == history.size();
  }
  render_history(m, v, history);
  if (m.covered >= m.text.size() && !m.fed.empty()) {
    m.covered -= std::min(m.covered, draft_piece(v, m.fed.back()).size());
    m.fed.pop_back();
  }
  m.base = m.fed.size();
  if (m.covered >= m.text.size()) {  // nothing spelled yet, and no BOS to start from
    if (m.fed.empty() && v.draft->bos() >= 0) {
      out.push_back(v.draft->bos());
      return true;
    }
    return false;
  }
  // Up to the last whole character (the rest of one split across target tokens comes later).
  const std::string_view rest = std::string_view(m.text).substr(m.covered);
  const std::string_view whole = rest.substr(0, models::utf8_complete_prefix(rest));
  const std::vector<int32_t> toks = v.draft->encode_continuation(whole);
  // Only tokens that spell the text back, in order (an odd byte may not round-trip).
  size_t at = 0, taken = 0;
  for (const int32_t id : toks) {
    if (static_cast<int64_t>(taken) == max) break;
    const std::string p = draft_piece(v, id);
    if (p.empty() || whole.compare(at, p.size(), p) != 0) break;
    at += p.size();
    out.push_back(id);
    ++taken;
  }
  if (taken == 0 && m.fed.empty()) return false;
  if (taken == 0) {
    // Nothing new spells cleanly: give the logits of what is there again.
    out.push_back(m.fed.back());
    m.covered -= std::min(m.covered, draft_piece(v, m.fed.back()).size());
    m.fed.pop_back();
    m.base = m.fed.size();
    return false;
  }
  return at == rest.size();
}

void commit_fed(draft_mirror& m, const draft_vocab& v, std::span<const int32_t> fed) {
  for (const int32_t id : fed) {
    m.fed.push_back(id);
    if (v.draft) m.covered += draft_piece(v, id).size();
  }
  m.covered = std::min(m.covered, m.text.size());
  m.base = m.fed.size();
}

void to_target(const draft_vocab& v, std::span<const int32_t> proposed, int64_t max, std::vector<int32_t>& out) {
  if (max <= 0) return;
  if (!v.draft) {
    const size_t n = std::min(proposed.size(), static_cast<size_t>(max));
    out.insert(out.end(), proposed.begin(), proposed.begin() + static_cast<std::ptrdiff_t>(n));
    return;
  }
  std::string text;
  for (const int32_t id : proposed) text += draft_piece(v, id);
  text.resize(models::utf8_complete_prefix(text));
  std::vector<int32_t> toks = v.target->encode_continuation(text);
  if (toks.size() > 1) toks.pop_back();  // it may end inside a longer target token
  const size_t n = std::min(toks.size(), static_cast<size_t>(max));
  out.insert(out.end(), toks.begin(), toks.begin() + static_cast<std::ptrdiff_t>(n));
}

void resync(draft_mirror& m, const draft_vocab& v, std::span<const int32_t> history) {
  size_t i = m.base;
  if (!v.draft) {
    while (i < m.fed.size() && i < history.size() && m.fed[i] == history[i]) ++i;
  } else {
    render_history(m, v, history);
    for (; i < m.fed.size(); ++i) {
      const std::string p = draft_piece(v, m.fed[i]);
      if (p.empty() || m.text.compare(m.covered, p.size(), p) != 0) break;
      m.covered += p.size();
    }
  }
  m.fed.resize(i);
  m.base = i;
}

}  // namespace tandem::runtime
