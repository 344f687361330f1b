// Token sampling: greedy, temperature, top-k, top-p, min-p, repetition penalty, seeded RNG.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace tandem::runtime {

// Defaults follow llama.cpp's CLI (temp 0.8, top-k 40, top-p 0.95, min-p 0.05, no penalty).
struct sampling_params {
  float temperature = 0.8f;    // <= 0: greedy (argmax, ties to the lowest id)
  int top_k = 40;              // <= 0: disabled
  float top_p = 0.95f;         // >= 1: disabled
  float min_p = 0.05f;         // <= 0: disabled
  float repeat_penalty = 1.0f; // 1: disabled; applied to the last repeat_last_n tokens
  int repeat_last_n = 64;
  uint64_t seed = 0xDEADBEEF;
};

// Stateful per sequence (owns the RNG). Order of the chain: repetition penalty, top-k,
// top-p, min-p (both on the temperature-1 distribution), temperature, softmax, draw;
// llama.cpp's common sampler order (temperature last).
class sampler {
 public:
  explicit sampler(const sampling_params& p);
  // Picks the next token from logits (n_vocab floats; may be modified in place). history is
  // the sequence so far (prompt + generated), used by the repetition penalty.
  int32_t sample(std::span<float> logits, std::span<const int32_t> history);
  const sampling_params& params() const { return params_; }

 private:
  sampling_params params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;  // reused across calls
};

}  // namespace tandem::runtime
