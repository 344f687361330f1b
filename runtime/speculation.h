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
#include <deque>
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
  // ngram: where the sequence's own tokens have no match, look in the model's recent outputs
  // too (ngram_cache): code repeats its identifiers across requests.
  bool ngram_cache = false;
};

// The n-gram lookup both proposers share: the longest suffix of `context`, of n_max down to
// n_min tokens, that occurs in `corpus` with at least one token after it, and up to `max` of
// the tokens that follow it, appended to `out`. Of several matches, the first one ending at or
// after `prefer_from` (a position in corpus), else the last one. Returns the corpus position
// just after the match (where the proposals start), or -1 when none matched.
int64_t lookup_proposals(std::span<const int32_t> corpus, std::span<const int32_t> context, int n_min, int n_max, int64_t prefer_from, int64_t max,
                         std::vector<int32_t>& out);

// A model's recent outputs, newest last, for n-gram lookup across requests; the oldest are
// dropped once they hold more than max_tokens. Engine thread only.
class ngram_cache {
 public:
  explicit ngram_cache(int64_t max_tokens = 16384) : max_tokens_(max_tokens) {}
  void add(std::span<const int32_t> output);
  // lookup_proposals in each output, newest first, preferring the last match within one;
  // whether one matched (its proposals appended to `out`).
  bool lookup(std::span<const int32_t> context, int n_min, int n_max, int64_t max, std::vector<int32_t>& out) const;
  int64_t tokens() const { return tokens_; }
  size_t outputs() const { return outputs_.size(); }

 private:
  std::deque<std::vector<int32_t>> outputs_;
  int64_t tokens_ = 0;
  int64_t max_tokens_;
};

// How many tokens a sequence proposes in its next pass: starts at the model's maximum, halves
// toward what was accepted after a miss and goes back to the maximum after a pass that kept
// everything (accepted runs are long: a block of code repeated, a predicted answer back in step).
// Each guess's chance of being accepted, given the ones before it were: guesses accepted
// over guesses judged (those accepted and the first rejected one of each pass), both decaying
// by pass so recent text weighs most.
struct acceptance_record {
  double hits = 0, judged = 0;
  void add(int64_t proposed, int64_t accepted);
  double rate() const { return judged > 0 ? hits / judged : -1.0; }  // -1 until measured
};

struct spec_window {
  int64_t size = 0;  // 0 until the first proposal: then the maximum
  acceptance_record record;
  // A draft that does not pay (engine::draft_length): passes since the sequence's last
  // proposal, and how many it waits before guessing once more (doubling while none pays).
  int64_t passes_idle = 0, probe_gap = 0;
  // Whether this sequence tries the draft afresh, whatever the model's record says (-1: not
  // decided yet; engine::draft_length decides when it first asks).
  int trial = -1;
  void learn(int64_t proposed, int64_t accepted, int64_t max);
  int64_t next(int64_t max) const { return size <= 0 ? max : std::min(size, max); }
};

// Proposals by a draft model cost a draft pass each, `cost_ratio` times a target pass; a
// verifying pass is taken to cost what a plain one does (bound by reading the weights). With
// each guess accepted with probability `acceptance` (independently), k guesses give
// (1 - a^(k+1)) / (1 - a) tokens for 1 + cost_ratio x k passes' time: the k in [0, room] with
// the most tokens per time. 0 when no k beats a plain pass.
int64_t best_draft_length(double acceptance, double cost_ratio, int64_t room);

}  // namespace tandem::runtime
