// Token sampling: greedy, temperature, top-k, top-p, min-p, repetition, presence and frequency
// penalties, seeded RNG.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

namespace tandem::runtime {

// A sampled token's log-probability and the most likely tokens' (OpenAI's logprobs and
// top_logprobs), most likely first.
struct token_logprob {
  float logprob = 0;
  std::vector<std::pair<int32_t, float>> top;
};

// From a row of raw logits (before penalties and temperature, as vLLM's default reports
// them): log-softmax at `token`, and the `top` most likely (0..20). NaN counts as -inf.
token_logprob log_probabilities(std::span<const float> logits, int32_t token, int top);

// Defaults follow llama.cpp's CLI (temp 0.8, top-k 40, top-p 0.95, min-p 0.05, no penalty).
// The sampler constructor rejects values outside the stated ranges (NaN included).
struct sampling_params {
  float temperature = 0.8f;     // finite, >= 0; 0: greedy (argmax, ties to the lowest id)
  int top_k = 40;               // <= 0: disabled
  float top_p = 0.95f;          // in [0, 1]; 1: disabled; 0 keeps only the best token
  float min_p = 0.05f;          // in [0, 1]; 0: disabled
  float repeat_penalty = 1.0f;  // finite, > 0; 1: disabled; applied to the last repeat_last_n tokens
  int repeat_last_n = 64;       // >= -1; -1: the whole history, 0: none
  // Each in [-2, 2]; 0: disabled. Over the same last repeat_last_n tokens, a token seen c times
  // loses c * frequency_penalty + presence_penalty from its logit (OpenAI's definition;
  // negative values favour repeats).
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  uint64_t seed = 0xDEADBEEF;
};

// Stateful per sequence (owns the RNG). Order of the chain: penalties (repetition, then
// presence and frequency, as llama.cpp's penalties sampler), top-k, top-p, min-p (both on the
// temperature-1 distribution), temperature, softmax, draw; llama.cpp's common sampler order
// (temperature last). The candidates are ordered only as far as the filters and the draw
// look, and with no filter the draw walks the vocabulary in id order (the same distribution):
// sorting a 152K vocabulary for every token took ~14 ms, on the engine's thread, per stream.
//
// Non-finite logits: NaN counts as -inf (never picked). When any logit is +inf the pick is
// among the +inf tokens only: the lowest id for greedy, otherwise uniform over the first
// top_k of them by id (all of them when top-k is off). A -inf token is never picked unless
// every token is -inf or NaN, in which case the answer is token 0.
class sampler {
 public:
  // Throws std::invalid_argument naming the field when a parameter is out of range.
  explicit sampler(const sampling_params& p);
  // Picks the next token from logits (n_vocab floats; modified in place: NaNs become -inf and
  // the penalties are applied). history is the sequence so far (prompt + generated), used by the
  // penalties; ids outside the vocabulary are ignored. Throws std::invalid_argument
  // for empty logits.
  int32_t sample(std::span<float> logits, std::span<const int32_t> history);
  const sampling_params& params() const { return params_; }

 private:
  int32_t sample_infinite(std::span<const float> logits);

  sampling_params params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;  // reused across calls
  std::vector<float> weights_;                         // the unfiltered draw's, reused
  std::unordered_map<int32_t, int32_t> counts_;        // penalty window: token -> occurrences; reused
};

}  // namespace tandem::runtime
