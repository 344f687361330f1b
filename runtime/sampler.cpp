#include "runtime/sampler.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <stdexcept>
#include <string>

namespace tandem::runtime {
namespace {

constexpr float k_inf = std::numeric_limits<float>::infinity();

[[noreturn]] void bad_param(const char* field, const char* need, double value) {
  char text[64];
  std::snprintf(text, sizeof text, "%g", value);
  throw std::invalid_argument(std::string("sampling_params.") + field + " must be " + need + ", got " + text);
}

// Written as "!(in range)" so NaN fails every check.
void validate(const sampling_params& p) {
  if (!(std::isfinite(p.temperature) && p.temperature >= 0.0f)) bad_param("temperature", "finite and >= 0", p.temperature);
  if (!(p.top_p >= 0.0f && p.top_p <= 1.0f)) bad_param("top_p", "in [0, 1]", p.top_p);
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f)) bad_param("min_p", "in [0, 1]", p.min_p);
  // 0 divides positive logits by zero (a repeated token becomes certain); below 0 flips signs.
  if (!(std::isfinite(p.repeat_penalty) && p.repeat_penalty > 0.0f))
    bad_param("repeat_penalty", "finite and > 0", p.repeat_penalty);
  if (p.repeat_last_n < -1) bad_param("repeat_last_n", ">= -1", p.repeat_last_n);
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f))
    bad_param("presence_penalty", "in [-2, 2]", p.presence_penalty);
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f))
    bad_param("frequency_penalty", "in [-2, 2]", p.frequency_penalty);
}

}  // namespace

sampler::sampler(const sampling_params& p) : params_(p), rng_(p.seed) { validate(p); }

int32_t sampler::sample(std::span<float> logits, std::span<const int32_t> history) {
  if (logits.empty()) throw std::invalid_argument("sampler: empty logits (vocabulary of size 0)");
  const auto n = static_cast<int32_t>(logits.size());
  const auto& p = params_;

  // NaN would poison every comparison below (and make the sort's comparator invalid, which is
  // undefined behaviour), so it becomes -inf: never picked while any other token is possible.
  for (float& v : logits)
    if (std::isnan(v)) v = -k_inf;

  // Penalties as llama.cpp's penalties sampler: per distinct token of the window, the
  // repetition penalty divides a positive logit and multiplies a negative one (once, however
  // often the token repeats), then presence and frequency subtract.
  const bool penalised = p.repeat_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
  if (penalised && p.repeat_last_n != 0 && !history.empty()) {
    const size_t last = p.repeat_last_n < 0 ? history.size() : std::min<size_t>(history.size(), p.repeat_last_n);
    counts_.clear();
    for (size_t k = history.size() - last; k < history.size(); ++k) {
      const int32_t t = history[k];
      if (t >= 0 && t < n) ++counts_[t];
    }
    for (const auto& [t, count] : counts_) {
      float& v = logits[t];
      v = v > 0 ? v / p.repeat_penalty : v * p.repeat_penalty;
      v -= static_cast<float>(count) * p.frequency_penalty + p.presence_penalty;
    }
  }

  if (p.temperature <= 0.0f) {
    // Greedy: first maximum, so ties resolve to the lowest id deterministically; this also
    // covers +inf (the first one) and all -inf (token 0).
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  // Checked after the penalty, which can overflow a huge finite logit to +inf.
  if (std::find(logits.begin(), logits.end(), k_inf) != logits.end()) return sample_infinite(logits);

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

  const float max_logit = candidates_.front().first;
  // Every token is -inf: nothing has any probability, and -inf - -inf would be NaN below.
  if (max_logit == -k_inf) return 0;

  // Top-p and min-p judge the distribution at temperature 1; temperature only reshapes what
  // survives them. This is llama.cpp's default chain (top-k, top-p, min-p, temperature), so a
  // given temperature keeps the same tokens in play here as there.
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
  // Weight-0 tokens (-inf logits, or underflow at low temperature) sit at the end; drop them
  // so rounding in the draw below can never land on one. The first weight is exp(0) = 1.
  while (candidates_.back().first <= 0.0f) candidates_.pop_back();

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

int32_t sampler::sample_infinite(std::span<const float> logits) {
  // Every +inf token is infinitely more likely than any finite one and equally likely among
  // themselves; top-k keeps the lowest ids, as the sort's tie rule does for finite logits.
  const auto n = static_cast<int64_t>(logits.size());
  const int64_t limit = params_.top_k > 0 ? params_.top_k : n;
  int64_t count = 0;
  for (int64_t i = 0; i < n && count < limit; ++i) count += logits[i] == k_inf;
  std::uniform_int_distribution<int64_t> dist(0, count - 1);
  int64_t pick = dist(rng_);
  for (int64_t i = 0; i < n; ++i)
    if (logits[i] == k_inf && pick-- == 0) return static_cast<int32_t>(i);
  return 0;  // unreachable: count >= 1 when called
}

}  // namespace tandem::runtime
