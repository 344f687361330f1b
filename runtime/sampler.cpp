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
  if (!(std::isfinite(p.repeat_penalty) && p.repeat_penalty > 0.0f)) bad_param("repeat_penalty", "finite and > 0", p.repeat_penalty);
  if (p.repeat_last_n < -1) bad_param("repeat_last_n", ">= -1", p.repeat_last_n);
  if (!(p.presence_penalty >= -2.0f && p.presence_penalty <= 2.0f)) bad_param("presence_penalty", "in [-2, 2]", p.presence_penalty);
  if (!(p.frequency_penalty >= -2.0f && p.frequency_penalty <= 2.0f)) bad_param("frequency_penalty", "in [-2, 2]", p.frequency_penalty);
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

  // No filter (OpenAI's defaults: no top-k, top-p 1, min-p 0): the draw walks the vocabulary
  // in id order, which draws from the same distribution as best first without ordering it.
  // Weight-0 tokens (-inf logits, or underflow at low temperature) are never returned.
  const bool filtered = (p.top_k > 0 && p.top_k < n) || p.top_p < 1.0f || p.min_p > 0.0f;
  if (!filtered) {
    const float max_logit = *std::max_element(logits.begin(), logits.end());
    if (max_logit == -k_inf) return 0;
    weights_.resize(static_cast<size_t>(n));
    double total = 0;
    for (int32_t i = 0; i < n; ++i) total += weights_[i] = std::exp((logits[i] - max_logit) / p.temperature);
    std::uniform_real_distribution<double> dist(0.0, total);
    double r = dist(rng_);
    int32_t last = -1;
    for (int32_t i = 0; i < n; ++i) {
      if (weights_[i] <= 0.0f) continue;
      last = i;
      r -= weights_[i];
      if (r <= 0) return i;
    }
    return last;
  }

  // Candidates best first (ties to the lowest id), but ordered only as far as the filters and
  // the draw look: a full sort of a 152K vocabulary took ~14 ms a token (2.5 ms at 32K), on
  // the engine's thread, for every stream of OpenAI's defaults (no top-k). [0, sorted) is in
  // final order and ahead of everything in [sorted, pool); [0, pool) is what is still in play.
  candidates_.resize(n);
  for (int32_t i = 0; i < n; ++i) candidates_[i] = {logits[i], i};
  auto by_logit = [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); };
  const auto first = candidates_.begin();
  size_t pool = candidates_.size(), sorted = 0;
  // Keeps the best k in play: ordered when k is small (a heap of k beats a selection then),
  // else as a set whose order comes later.
  auto cut = [&](size_t k) {
    if (k >= pool) return;
    if (k > sorted && k <= 1024) {
      std::partial_sort(first + static_cast<ptrdiff_t>(sorted), first + static_cast<ptrdiff_t>(k), first + static_cast<ptrdiff_t>(pool), by_logit);
      sorted = k;
    } else if (k > sorted) {
      std::nth_element(first + static_cast<ptrdiff_t>(sorted), first + static_cast<ptrdiff_t>(k), first + static_cast<ptrdiff_t>(pool), by_logit);
    }
    pool = k;
    sorted = std::min(sorted, k);
  };
  // Orders the next stretch: eight times what is ordered (256 at first), at most the pool. Each
  // step selects from the whole rest, so few and growing steps keep the total near one pass.
  auto order_more = [&] {
    const size_t k = std::min(pool, std::max<size_t>(256, 8 * sorted));
    if (k < pool)
      std::nth_element(first + static_cast<ptrdiff_t>(sorted), first + static_cast<ptrdiff_t>(k), first + static_cast<ptrdiff_t>(pool), by_logit);
    std::sort(first + static_cast<ptrdiff_t>(sorted), first + static_cast<ptrdiff_t>(k), by_logit);
    sorted = k;
  };

  if (p.top_k > 0) cut(static_cast<size_t>(p.top_k));
  float max_logit = -k_inf;
  for (size_t i = 0; i < pool; ++i) max_logit = std::max(max_logit, candidates_[i].first);
  // Every token is -inf: nothing has any probability, and -inf - -inf would be NaN below.
  if (max_logit == -k_inf) return 0;

  // Top-p and min-p judge the distribution at temperature 1; temperature only reshapes what
  // survives them. This is llama.cpp's default chain (top-k, top-p, min-p, temperature), so a
  // given temperature keeps the same tokens in play here as there.
  if (p.top_p < 1.0f) {
    // Float exponentials (a double exp per token was most of a large vocabulary's cost), summed
    // in double.
    auto mass = [&](size_t i) { return static_cast<double>(std::exp(candidates_[i].first - max_logit)); };
    double sum = 0;
    for (size_t i = 0; i < pool; ++i) sum += mass(i);
    // Smallest prefix whose mass reaches top_p (at least one token).
    double cum = 0;
    size_t k = 0;
    while (k < pool) {
      if (k == sorted) order_more();
      cum += mass(k) / sum;
      ++k;
      if (cum >= p.top_p) break;
    }
    cut(k);
  }
  // Min-p: drop tokens less likely than min_p times the most likely one, i.e. whose logit is
  // below max + ln(min_p) (a ratio of probabilities, so no normalisation is needed). Those at or
  // above the floor are a prefix of the order, so counting them is enough.
  if (p.min_p > 0.0f) {
    const float floor = max_logit + std::log(p.min_p);
    size_t k = 0;
    for (size_t i = 0; i < pool; ++i) k += candidates_[i].first >= floor;
    cut(std::max<size_t>(k, 1));
  }

  // Temperature, then the softmax weights of the survivors (unnormalised: the draw scales),
  // best first. Weight-0 tokens come last in that order and add nothing, so rounding in the
  // draw cannot land on one. The best token weighs exp(0) = 1.
  auto weight = [&](size_t i) { return std::exp((candidates_[i].first - max_logit) / p.temperature); };
  double total = 0;
  for (size_t i = 0; i < pool; ++i) total += weight(i);
  std::uniform_real_distribution<double> dist(0.0, total);
  double r = dist(rng_);
  int32_t last = -1;
  for (size_t k = 0; k < pool; ++k) {
    if (k == sorted) order_more();
    const float w = weight(k);
    if (w <= 0.0f) break;  // the rest weigh nothing either
    last = candidates_[k].second;
    r -= w;
    if (r <= 0) return last;
  }
  return last;
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

token_logprob log_probabilities(std::span<const float> logits, int32_t token, int top) {
  token_logprob out;
  float mx = -std::numeric_limits<float>::infinity();
  for (const float v : logits)
    if (v > mx) mx = v;  // (NaN compares false)
  if (!std::isfinite(mx)) {
    out.logprob = -std::numeric_limits<float>::infinity();
    return out;
  }
  double sum = 0;
  for (const float v : logits)
    if (v > -std::numeric_limits<float>::infinity()) sum += std::exp(static_cast<double>(v - mx));
  const double lse = static_cast<double>(mx) + std::log(sum);
  auto lp = [&](float v) { return v == v ? static_cast<float>(static_cast<double>(v) - lse) : -std::numeric_limits<float>::infinity(); };
  if (token >= 0 && static_cast<size_t>(token) < logits.size()) out.logprob = lp(logits[static_cast<size_t>(token)]);
  const auto n = std::min<size_t>(static_cast<size_t>(std::max(top, 0)), logits.size());
  if (n > 0) {
    // The n best kept sorted while walking the row once (n <= 20 in practice): no buffer the
    // size of the vocabulary on the sampling path. Ties go to the lower id (seen first).
    auto& top_n = out.top;
    top_n.reserve(n + 1);
    for (size_t i = 0; i < logits.size(); ++i) {
      const float v = lp(logits[i]);
      if (top_n.size() == n && !(v > top_n.back().second)) continue;
      size_t at = top_n.size();
      while (at > 0 && v > top_n[at - 1].second) --at;
      top_n.insert(top_n.begin() + static_cast<std::ptrdiff_t>(at), {static_cast<int32_t>(i), v});
      if (top_n.size() > n) top_n.pop_back();
    }
  }
  return out;
}

}  // namespace tandem::runtime
