// A target sequence's mirror in its draft model (speculation by a second, smaller model): the
// draft tokens whose KV the draft holds for it, and, when the two vocabularies differ, the
// target's text those tokens spell. The engine feeds the draft what the target accepted since
// the last pass (catch_up), lets it propose greedily, turns its proposals into target tokens
// (to_target) and, after verification, keeps of its fed tokens those that still agree with
// the target's history (resync). The functions here are pure: the engine moves the KV.
//
// Different vocabularies meet at text: the target's history is rendered to bytes piece by
// piece, the draft is fed that text retokenized with its own tokenizer (no space prefix: it
// continues), and its proposals are detokenized and retokenized with the target's tokenizer
// at the target's last token boundary. The last target token of a retokenized proposal is
// dropped (the draft's text may end inside a word the target spells as one token).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "models/tokenizer.h"

namespace tandem::runtime {

struct draft_mirror {
  int64_t seq = -1;          // the draft model's sequence slot; -1: none
  std::vector<int32_t> fed;  // draft tokens in the draft's KV, in order (fed.size() is its pos)
  size_t base = 0;           // fed[0..base) stood for the target's history when proposing began
  // Different vocabularies only.
  std::string text;        // the target's history as text (special tokens rendered)
  size_t text_tokens = 0;  // history tokens rendered into text
  size_t covered = 0;      // bytes of text that fed[0..base) spell
};

// The two sides of a mirror: `draft` null when the vocabularies are the same (ids straight).
struct draft_vocab {
  const models::tokenizer* target = nullptr;
  const models::tokenizer* draft = nullptr;
};

// Whether two tokenizers have the same tokens in the same order (ids may pass straight).
bool same_vocabulary(const models::tokenizer& a, const models::tokenizer& b);

// Starts an empty mirror: the draft's BOS first when its tokenizer adds one (different
// vocabularies; the same vocabulary takes the target's own tokens, BOS included).
void start_mirror(draft_mirror& m, const draft_vocab& v);

// The draft tokens to feed next so that the draft has seen the whole history (at most `max`;
// more are left for the next pass), appended to `out`; m.fed is cut first where needed so
// that the rows give the logits of the history's end (at least one token is fed when the
// history is not empty). Returns whether the fed tokens then reach the history's end (the
// draft may propose). The caller feeds exactly `out` and appends it to m.fed (commit_fed).
bool catch_up(draft_mirror& m, const draft_vocab& v, std::span<const int32_t> history, int64_t max, std::vector<int32_t>& out);
void commit_fed(draft_mirror& m, const draft_vocab& v, std::span<const int32_t> fed);

// The draft's proposals (its vocabulary) as target tokens, at most `max`, appended to `out`.
// Same vocabulary: as they are.
void to_target(const draft_vocab& v, std::span<const int32_t> proposed, int64_t max, std::vector<int32_t>& out);

// After the target's pass: m.fed cut to the tokens that agree with the history (those of
// m.fed[m.base..] that spell what the target accepted); m.base = m.fed.size().
void resync(draft_mirror& m, const draft_vocab& v, std::span<const int32_t> history);

}  // namespace tandem::runtime
