// Speculative decoding's proposers and the per-sequence draft length. A proposer guesses the
// next tokens of a sequence; the engine verifies them in one pass (the sequence's last token
// and k proposals as k + 1 rows), keeps the longest prefix the target's own sampling agrees
// with plus the token it sampled where they part, and gives the rest of the rows' KV back.
//
// Every proposer here is deterministic (a draft model proposes its greedy argmax): its guess is a function of the tokens so far, never a
// random draw. For such a proposal q is a point mass on the guessed token d, and standard
// speculative sampling (accept d with probability min(1, p(d) / q(d)) = p(d); on rejection
// draw from max(0, p - q), which is p without d, renormalised) is exactly: draw from p as
// usual and accept while the draw equals the guess. So the engine samples each row with the
// request's own sampler, one draw per emitted token in the same order as without
// speculation: greedy and seeded outputs are the same token for token.
#pragma once

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace tandem::runtime {

enum class spec_method {
  off,
  ngram,  // prompt lookup: the sequence's own tokens (prompt and output) as the corpus
  draft,  // a second, smaller model's greedy guesses (engine_model::draft; draft_mirror.h)
};

// A served model's speculation (roster `speculate:`; `tandem run --draft-ngram`).
struct spec_settings {
  spec_method method = spec_method::off;
  int64_t max_tokens = 8;  // proposals verified in one pass, at most
};

// The n-gram lookup both proposers share: the longest suffix of `context`, of n_max down to
// n_min tokens, that occurs in `corpus` with at least one token after it, and up to `max` of
// the tokens that follow it, appended to `out`. Of several matches, the first one ending at or
// after `prefer_from` (a position in corpus), else the last one. Returns the corpus position
// just after the match (where the proposals start), or -1 when none matched.
int64_t lookup_proposals(std::span<const int32_t> corpus, std::span<const int32_t> context, int n_min, int n_max, int64_t prefer_from, int64_t max,
                         std::vector<int32_t>& out);

// How many tokens a sequence proposes in its next pass: starts at the model's maximum, halves
// toward what was accepted after a miss and doubles back after a pass that kept everything.
struct spec_window {
  int64_t size = 0;  // 0 until the first proposal: then the maximum
  void learn(int64_t proposed, int64_t accepted, int64_t max);
  int64_t next(int64_t max) const { return size <= 0 ? max : std::min(size, max); }
};

}  // namespace tandem::runtime
