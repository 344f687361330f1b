#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <unordered_set>

namespace tandem::runtime {

sampler::sampler(const sampling_params& p) : params_(p), rng_(p.seed) {}

int32_t sampler::sample(std::span<float> logits, std::span<const int32_t> history) {
  const auto n = static_cast<int32_t>(logits.size());
  const auto& p = params_;

  // Repetition penalty as in llama.cpp: divide positive logits, multiply negative ones, once
  // per distinct recent token.
  if (p.repeat_penalty != 1.0f && p.repeat_last_n != 0 && !history.empty()) {
    const size_t last = p.repeat_last_n < 0 ? history.size() : std::min<size_t>(history.size(), p.repeat_last_n);
    std::unordered_set<int32_t> seen;
    for (size_t k = history.size() - last; k < history.size(); ++k) {
      const int32_t t = history[k];
      if (t < 0 || t >= n || !seen.insert(t).second) continue;
      logits[t] = logits[t] > 0 ? logits[t] / p.repeat_penalty : logits[t] * p.repeat_penalty;
    }
  }

  if (p.temperature <= 0.0f) {
    // Greedy: first maximum, so ties resolve to the lowest id deterministically.
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }

  candidates_.resize(n);
  for (int32_t i = 0; i < n; ++i) candidates_[i] = {logits[i], i};
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };

  size_t keep = candidates_.size();
  if (p.top_k > 0 && static_cast<size_t>(p.top_k) < keep) {
    std::partial_sort(candidates_.begin(), candidates_.begin() + p.top_k, candidates_.end(), by_logit);
    keep = p.top_k;
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }
  candidates_.resize(keep);

  // Top-p and min-p judge the distribution at temperature 1; temperature only reshapes what
  // survives them. This is llama.cpp's default chain (top-k, top-p, min-p, temperature), so a
  // given temperature keeps the same tokens in play here as there.
  const float max_logit = candidates_.front().first;
  if (p.top_p < 1.0f) {
    double sum = 0;
    for (const auto& c : candidates_) sum += std::exp(static_cast<double>(c.first - max_logit));
    // Smallest prefix whose mass reaches top_p (at least one token).
    double cum = 0;
    size_t k = 0;
    while (k < candidates_.size()) {
      cum += std::exp(static_cast<double>(candidates_[k].first - max_logit)) / sum;
      ++k;
      if (cum >= p.top_p) break;
    }
    candidates_.resize(k);
  }
  // Min-p: drop tokens less likely than min_p times the most likely one, i.e. whose logit is
  // below max + ln(min_p) (a ratio of probabilities, so no normalisation is needed).
  if (p.min_p > 0.0f) {
    const float floor = max_logit + std::log(p.min_p);
    size_t k = 1;
    while (k < candidates_.size() && candidates_[k].first >= floor) ++k;
    candidates_.resize(k);
  }

  // Temperature, then the softmax weights of the survivors (unnormalised: the draw scales).
  for (auto& c : candidates_) c.first = std::exp((c.first - max_logit) / p.temperature);

  double total = 0;
  for (const auto& c : candidates_) total += c.first;
  std::uniform_real_distribution<double> dist(0.0, total);
  double r = dist(rng_);
  for (const auto& c : candidates_) {
    r -= c.first;
    if (r <= 0) return c.second;
  }
  return candidates_.back().second;
}

}  // namespace tandem::runtime
