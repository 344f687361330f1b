#include "runtime/sampler.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <stdexcept>
#include <random>
#include <set>
#include <vector>

#include "tests/test_support.h"

using namespace tandem::runtime;

namespace {

sampling_params greedy_params() {
  sampling_params p;
  p.temperature = 0.0f;
  return p;
}

// Plain sampling: temperature only, every filter off.
sampling_params plain_params(float temperature, uint64_t seed) {
  sampling_params p;
  p.temperature = temperature;
  p.top_k = 0;
  p.top_p = 1.0f;
  p.min_p = 0.0f;
  p.seed = seed;
  return p;
}

std::vector<float> random_logits(std::mt19937& rng, int n, float sd) {
  std::normal_distribution<float> dist(0.0f, sd);
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = dist(rng);
  return v;
}

int32_t draw(sampler& s, std::vector<float> logits, const std::vector<int32_t>& history = {}) {
  return s.sample(logits, history);  // by value: sample may modify the logits
}

constexpr float k_nan = std::numeric_limits<float>::quiet_NaN();
constexpr float k_inf = std::numeric_limits<float>::infinity();

// The ids drawn over `draws` calls.
std::set<int32_t> ids_drawn(sampler& s, const std::vector<float>& logits, int draws) {
  std::set<int32_t> seen;
  for (int i = 0; i < draws; ++i) seen.insert(draw(s, logits));
  return seen;
}

}  // namespace

TEST_SUITE("sampler") {
  TEST_CASE("greedy picks the argmax, ties to the lowest id") {
    sampler s(greedy_params());
    CHECK(draw(s, {0.1f, 2.5f, -1.0f, 2.4f}) == 1);
    CHECK(draw(s, {1.0f, 3.0f, 3.0f, 3.0f}) == 1);
    CHECK(draw(s, {-5.0f, -5.0f}) == 0);
    std::mt19937 rng(1);
    for (int i = 0; i < 20; ++i) {
      const auto l = random_logits(rng, 500, 3.0f);
      const auto best = int32_t(std::max_element(l.begin(), l.end()) - l.begin());
      CHECK(draw(s, l) == best);
    }
  }

  TEST_CASE("the same seed gives the same sequence, another seed a different one") {
    std::mt19937 rng(2);
    std::vector<std::vector<float>> steps;
    for (int i = 0; i < 64; ++i) steps.push_back(random_logits(rng, 200, 1.0f));
    auto run = [&](uint64_t seed) {
      sampling_params p;  // the defaults: top-k 40, top-p 0.95, min-p 0.05, temp 0.8
      p.seed = seed;
      p.temperature = 1.5f;
      sampler s(p);
      std::vector<int32_t> out;
      for (const auto& l : steps) out.push_back(draw(s, l, out));
      return out;
    };
    const auto a = run(42), b = run(42), c = run(43);
    CHECK(a == b);
    CHECK(a != c);
  }

  TEST_CASE("top-k 1 equals greedy at any temperature") {
    std::mt19937 rng(3);
    for (float temp : {0.1f, 1.0f, 5.0f, 100.0f}) {
      CAPTURE(temp);
      sampling_params p = plain_params(temp, 9);
      p.top_k = 1;
      sampler s(p);
      sampler g(greedy_params());
      for (int i = 0; i < 50; ++i) {
        const auto l = random_logits(rng, 300, 0.5f);
        CHECK(draw(s, l) == draw(g, l));
      }
    }
  }

  TEST_CASE("top-k never picks a token outside the k best") {
    std::vector<float> l(100);
    for (int i = 0; i < 100; ++i) l[size_t(i)] = float(i % 10) * 0.01f + (i >= 95 ? 1.0f : 0.0f);  // ids 95..99 best
    sampling_params p = plain_params(50.0f, 4);
    p.top_k = 5;
    sampler s(p);
    std::set<int32_t> seen;
    for (int i = 0; i < 2000; ++i) {
      const int32_t t = draw(s, l);
      CHECK(t >= 95);
      seen.insert(t);
    }
    CHECK(seen.size() == 5);  // and at this temperature all five show up
  }

  TEST_CASE("top-p keeps the smallest prefix reaching p") {
    // Probabilities at temperature 1: 0.5, 0.3, 0.15, 0.05 (by construction).
    const std::vector<float> l = {std::log(0.15f), std::log(0.5f), std::log(0.05f), std::log(0.3f)};
    SUBCASE("p = 0.7 keeps ids 1 and 3") {
      sampling_params p = plain_params(1.0f, 5);
      p.top_p = 0.7f;
      sampler s(p);
      std::set<int32_t> seen;
      for (int i = 0; i < 3000; ++i) seen.insert(draw(s, l));
      CHECK(seen == std::set<int32_t>{1, 3});
    }
    SUBCASE("p = 0.9 keeps ids 1, 3, 0; temperature does not change the set") {
      for (float temp : {1.0f, 10.0f}) {
        sampling_params p = plain_params(temp, 6);
        p.top_p = 0.9f;
        sampler s(p);
        std::set<int32_t> seen;
        for (int i = 0; i < 3000; ++i) seen.insert(draw(s, l));
        CHECK(seen == std::set<int32_t>{0, 1, 3});
      }
    }
    SUBCASE("tiny p keeps only the best") {
      sampling_params p = plain_params(3.0f, 7);
      p.top_p = 0.01f;
      sampler s(p);
      for (int i = 0; i < 200; ++i) CHECK(draw(s, l) == 1);
    }
  }

  TEST_CASE("min-p drops tokens below min_p times the best") {
    // Relative to the best token (id 2): ids 0 and 4 at 0.5x, ids 1 and 3 at 0.02x.
    const float base = 2.0f;
    const std::vector<float> l = {base + std::log(0.5f), base + std::log(0.02f), base, base + std::log(0.02f), base + std::log(0.5f)};
    for (float temp : {1.0f, 20.0f}) {
      CAPTURE(temp);
      sampling_params p = plain_params(temp, 8);
      p.min_p = 0.1f;
      sampler s(p);
      std::set<int32_t> seen;
      for (int i = 0; i < 3000; ++i) seen.insert(draw(s, l));
      CHECK(seen == std::set<int32_t>{0, 2, 4});
    }
  }

  TEST_CASE("repetition penalty changes the pick as expected") {
    sampling_params p = greedy_params();
    p.repeat_penalty = 1.5f;
    p.repeat_last_n = 3;
    sampler s(p);
    // Positive logit divided: 3.0 / 1.5 = 2.0 < 2.5, so id 0 loses to id 1.
    CHECK(draw(s, {3.0f, 2.5f, 0.0f}, {0}) == 1);
    CHECK(draw(s, {3.0f, 2.5f, 0.0f}, {}) == 0);
    // Negative logit multiplied: -1 * 1.5 = -1.5 < -1.2, so id 0 loses to id 2.
    CHECK(draw(s, {-1.0f, -2.0f, -1.2f}, {0}) == 2);
    // Applied once per distinct token, however often it repeats: 3 / 1.5 = 2 > 1.9.
    CHECK(draw(s, {3.0f, 1.9f}, {0, 0, 0}) == 0);
    // Only the last repeat_last_n tokens count: id 0 is 4 tokens back.
    CHECK(draw(s, {3.0f, 2.5f, 0.0f}, {0, 2, 2, 2}) == 0);
    // Penalty 1 is a no-op.
    sampler plain(greedy_params());
    CHECK(draw(plain, {3.0f, 2.5f, 0.0f}, {0}) == 0);
  }

  TEST_CASE("presence and frequency penalties subtract c * frequency + presence per distinct token") {
    sampling_params p = greedy_params();
    p.presence_penalty = 0.5f;
    p.frequency_penalty = 0.25f;
    p.repeat_last_n = 4;
    sampler s(p);
    // Token 0 three times, token 2 once, token 1 never; 7 is outside the vocabulary and -1 is
    // not a token: both ignored.
    std::vector<float> l = {3.0f, 1.0f, -1.0f, 0.5f};
    const std::vector<int32_t> history = {0, 0, 2, 0, 7, -1};
    // Only the last four count: {2, 0, 7, -1} -> token 0 once, token 2 once.
    s.sample(l, history);
    CHECK(l[0] == doctest::Approx(3.0f - 0.25f - 0.5f));
    CHECK(l[1] == 1.0f);
    CHECK(l[2] == doctest::Approx(-1.0f - 0.25f - 0.5f));
    CHECK(l[3] == 0.5f);

    // The whole window: token 0 three times.
    p.repeat_last_n = -1;
    sampler whole(p);
    l = {3.0f, 1.0f, -1.0f, 0.5f};
    whole.sample(l, history);
    CHECK(l[0] == doctest::Approx(3.0f - 3 * 0.25f - 0.5f));
    CHECK(l[2] == doctest::Approx(-1.0f - 0.25f - 0.5f));

    // A window of 0 turns every penalty off.
    p.repeat_last_n = 0;
    sampler none(p);
    l = {3.0f, 1.0f, -1.0f, 0.5f};
    none.sample(l, history);
    CHECK(l == std::vector<float>{3.0f, 1.0f, -1.0f, 0.5f});
  }

  TEST_CASE("presence and frequency penalties change the pick") {
    sampling_params p = greedy_params();
    p.presence_penalty = 0.6f;
    sampler pres(p);
    CHECK(draw(pres, {3.0f, 2.5f}, {0}) == 1);     // 2.4 < 2.5
    CHECK(draw(pres, {3.0f, 2.5f}, {0, 0}) == 1);  // presence does not grow with the count
    CHECK(draw(pres, {3.0f, 2.3f}, {0, 0}) == 0);

    p = greedy_params();
    p.frequency_penalty = 0.2f;
    sampler freq(p);
    CHECK(draw(freq, {3.0f, 2.5f}, {0}) == 0);        // 2.8
    CHECK(draw(freq, {3.0f, 2.5f}, {0, 0, 0}) == 1);  // 2.4

    // Negative values favour what was already said.
    p = greedy_params();
    p.presence_penalty = -1.0f;
    sampler favour(p);
    CHECK(draw(favour, {2.5f, 3.0f}, {0}) == 0);  // 3.5 > 3.0
  }

  TEST_CASE("the repetition penalty divides before presence subtracts") {
    // 3 / 1.5 - 0.6 = 1.4 < 1.5; the other order would give (3 - 0.6) / 1.5 = 1.6 > 1.5.
    sampling_params p = greedy_params();
    p.repeat_penalty = 1.5f;
    p.presence_penalty = 0.6f;
    sampler s(p);
    CHECK(draw(s, {3.0f, 1.5f}, {0}) == 1);
    std::vector<float> l = {3.0f, 1.5f};
    s.sample(l, std::vector<int32_t>{0});
    CHECK(l[0] == doctest::Approx(1.4f));
  }

  TEST_CASE("the penalties apply before top-k") {
    // Top-1 after the penalty keeps token 1, at any temperature.
    sampling_params p = plain_params(5.0f, 31);
    p.top_k = 1;
    p.presence_penalty = 1.0f;
    sampler s(p);
    for (int i = 0; i < 50; ++i) CHECK(draw(s, {3.0f, 2.5f, 0.0f}, {0}) == 1);
  }

  TEST_CASE("presence and frequency penalties default to off") {
    const sampling_params p;
    CHECK(p.presence_penalty == 0.0f);
    CHECK(p.frequency_penalty == 0.0f);
    // With the repetition penalty at 1 too, the logits come back untouched.
    sampler s(plain_params(1.0f, 32));
    std::vector<float> l = {3.0f, -1.0f, 0.5f};
    s.sample(l, std::vector<int32_t>{0, 1, 1, 2});
    CHECK(l == std::vector<float>{3.0f, -1.0f, 0.5f});
  }

  TEST_CASE("at temperature 1 without filters the draws follow softmax") {
    std::mt19937 rng(10);
    const int n = 12;
    const auto l = random_logits(rng, n, 1.0f);
    double mx = -1e300, sum = 0;
    for (float v : l) mx = std::max<double>(mx, v);
    std::vector<double> prob(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) sum += prob[size_t(i)] = std::exp(double(l[size_t(i)]) - mx);
    for (auto& x : prob) x /= sum;

    sampler s(plain_params(1.0f, 12345));
    const int draws = 20000;
    std::vector<int> count(size_t(n), 0);
    for (int i = 0; i < draws; ++i) ++count[size_t(draw(s, l))];
    for (int i = 0; i < n; ++i) {
      CAPTURE(i);
      // 5 standard deviations of a binomial proportion (plus a floor for tiny p).
      const double p = prob[size_t(i)];
      const double sd = std::sqrt(p * (1 - p) / draws);
      CHECK(std::fabs(double(count[size_t(i)]) / draws - p) <= 5 * sd + 1e-3);
    }

    // Temperature 2 follows softmax(l / 2) instead.
    std::vector<double> prob2(static_cast<size_t>(n));
    double sum2 = 0;
    for (int i = 0; i < n; ++i) sum2 += prob2[size_t(i)] = std::exp((double(l[size_t(i)]) - mx) / 2);
    sampler s2(plain_params(2.0f, 54321));
    std::vector<int> count2(size_t(n), 0);
    for (int i = 0; i < draws; ++i) ++count2[size_t(draw(s2, l))];
    for (int i = 0; i < n; ++i) {
      const double p = prob2[size_t(i)] / sum2;
      const double sd = std::sqrt(p * (1 - p) / draws);
      CHECK(std::fabs(double(count2[size_t(i)]) / draws - p) <= 5 * sd + 1e-3);
    }
  }

  TEST_CASE("a large vocabulary with filters draws what ordering it all would draw") {
    // The sampler orders candidates only as far as its filters and the draw look; the chain
    // written out with a full sort must pick the same token from the same seed.
    auto reference = [](const sampling_params& p, std::mt19937_64& rng, const std::vector<float>& l) {
      std::vector<std::pair<float, int32_t>> c;
      for (size_t i = 0; i < l.size(); ++i) c.push_back({l[i], static_cast<int32_t>(i)});
      std::sort(c.begin(), c.end(), [](const auto& a, const auto& b) { return a.first > b.first || (a.first == b.first && a.second < b.second); });
      if (p.top_k > 0 && static_cast<size_t>(p.top_k) < c.size()) c.resize(static_cast<size_t>(p.top_k));
      const float mx = c.front().first;
      if (p.top_p < 1.0f) {
        double sum = 0, cum = 0;
        for (const auto& x : c) sum += std::exp(x.first - mx);
        size_t k = 0;
        while (k < c.size()) {
          cum += static_cast<double>(std::exp(c[k].first - mx)) / sum;
          ++k;
          if (cum >= p.top_p) break;
        }
        c.resize(k);
      }
      if (p.min_p > 0.0f) {
        size_t k = 1;
        while (k < c.size() && c[k].first >= mx + std::log(p.min_p)) ++k;
        c.resize(k);
      }
      while (std::exp((c.back().first - mx) / p.temperature) <= 0.0f) c.pop_back();  // weight 0: never drawn
      double total = 0;
      for (const auto& x : c) total += std::exp((x.first - mx) / p.temperature);
      double r = std::uniform_real_distribution<double>(0.0, total)(rng);
      for (const auto& x : c) {
        r -= std::exp((x.first - mx) / p.temperature);
        if (r <= 0) return x.second;
      }
      return c.back().second;
    };
    std::mt19937 lrng(21);
    struct cfg {
      int top_k;
      float top_p, min_p, temperature;
    };
    for (const cfg f : {cfg{0, 0.9f, 0.0f, 1.0f}, cfg{0, 0.97f, 0.01f, 0.7f}, cfg{50, 1.0f, 0.0f, 1.3f}, cfg{3000, 0.95f, 0.0f, 1.0f},
                        cfg{0, 1.0f, 0.001f, 1.0f}, cfg{40, 0.95f, 0.05f, 0.8f}, cfg{500, 0.9f, 0.02f, 1.0f}}) {
      CAPTURE(f.top_k);
      CAPTURE(f.top_p);
      CAPTURE(f.min_p);
      sampling_params p = plain_params(f.temperature, 777);
      p.top_k = f.top_k;
      p.top_p = f.top_p;
      p.min_p = f.min_p;
      sampler s(p);
      std::mt19937_64 rng(p.seed);
      for (int i = 0; i < 200; ++i) {
        auto l = random_logits(lrng, 6000, 2.5f);  // flat enough that thousands stay in play
        if (i % 2) {
          // Ties everywhere (quarter steps) and some -inf: the order's tie rule and weight-0 tail.
          for (auto& v : l) v = std::round(v * 4.0f) / 4.0f;
          for (size_t j = 0; j < l.size(); j += 7) l[j] = -k_inf;
        }
        CHECK(draw(s, l) == reference(p, rng, l));
      }
    }
  }

  TEST_CASE("NaN logits are never picked") {
    // NaNs spread among finite logits, at every position the sort could put them.
    std::vector<float> l(64);
    for (size_t i = 0; i < l.size(); ++i) l[i] = i % 3 == 0 ? k_nan : float(i % 7) * 0.1f;
    SUBCASE("greedy") {
      sampler g(greedy_params());
      CHECK(draw(g, {k_nan, 1.0f, k_nan, 0.5f}) == 1);
      CHECK(draw(g, {k_nan, -3.0f}) == 1);
      const int32_t t = draw(g, l);
      CHECK(t % 3 != 0);
      CHECK(l[size_t(t)] == doctest::Approx(0.6f));
    }
    SUBCASE("sampling, with and without filters") {
      sampling_params defaults;  // top-k, top-p and min-p on
      defaults.temperature = 5.0f;
      for (const sampling_params& p : {plain_params(5.0f, 21), defaults}) {
        sampler s(p);
        for (int32_t t : ids_drawn(s, l, 2000)) CHECK(t % 3 != 0);
      }
    }
    SUBCASE("the penalty does not revive a NaN") {
      sampling_params p = greedy_params();
      p.repeat_penalty = 2.0f;
      sampler g(p);
      CHECK(draw(g, {k_nan, -1.0f}, {0}) == 1);
    }
  }

  TEST_CASE("+inf logits win: the first for greedy, uniform among them when sampling") {
    const std::vector<float> l = {1.0f, k_inf, 3.0f, k_inf, k_nan, k_inf};
    sampler g(greedy_params());
    CHECK(draw(g, l) == 1);

    sampler s(plain_params(1.0f, 22));
    std::vector<int> count(l.size(), 0);
    const int draws = 3000;
    for (int i = 0; i < draws; ++i) ++count[size_t(draw(s, l))];
    CHECK(count[0] + count[2] + count[4] == 0);
    for (size_t id : {1, 3, 5}) {
      CAPTURE(id);
      CHECK(std::abs(count[id] / double(draws) - 1.0 / 3) < 0.05);  // ~6 standard deviations
    }

    sampling_params k2 = plain_params(1.0f, 23);
    k2.top_k = 2;  // keeps the two lowest +inf ids, as the tie rule does for equal logits
    sampler s2(k2);
    CHECK(ids_drawn(s2, l, 1000) == std::set<int32_t>{1, 3});
    k2.top_k = 1;
    sampler s1(k2);
    CHECK(ids_drawn(s1, l, 200) == std::set<int32_t>{1});
  }

  TEST_CASE("-inf logits are never picked; all -inf or NaN gives token 0") {
    sampler g(greedy_params());
    sampler s(plain_params(1.0f, 24));
    sampling_params defaults;
    sampler d(defaults);
    for (sampler* x : {&g, &s, &d}) {
      CHECK(draw(*x, {-k_inf, -k_inf, -k_inf}) == 0);
      CHECK(draw(*x, {k_nan, -k_inf, k_nan}) == 0);
      CHECK(draw(*x, {k_nan}) == 0);
      CHECK(ids_drawn(*x, {-k_inf, -k_inf, -40.0f, -k_inf}, 200) == std::set<int32_t>{2});
    }
    // Lowest id among the highest finite values, for greedy.
    CHECK(draw(g, {-k_inf, 2.0f, k_nan, 2.0f}) == 1);
  }

  TEST_CASE("tokens whose weight underflows at low temperature are never picked") {
    // At temperature 1e-3 exp(-10 / 1e-3) is 0 in double: only id 1 has any weight.
    sampler s(plain_params(1e-3f, 25));
    CHECK(ids_drawn(s, {-10.0f, 0.0f, -20.0f, -k_inf}, 500) == std::set<int32_t>{1});
  }

  TEST_CASE("empty logits are rejected") {
    sampler g(greedy_params());
    sampler s(plain_params(1.0f, 26));
    std::vector<float> none;
    CHECK_THROWS_AS(g.sample(none, {}), std::invalid_argument);
    CHECK_THROWS_AS(s.sample(none, {}), std::invalid_argument);
  }

  TEST_CASE("the constructor rejects out-of-range parameters, naming the field") {
    auto rejects = [](const char* field, auto set) {
      sampling_params p;
      set(p);
      CHECK_THROWS_WITH_AS(sampler{p}, doctest::Contains((std::string("sampling_params.") + field + " ").c_str()), std::invalid_argument);
    };
    for (float v : {0.0f, -1.0f, k_nan, k_inf}) {
      CAPTURE(v);
      rejects("repeat_penalty", [v](sampling_params& p) { p.repeat_penalty = v; });
    }
    for (float v : {-0.1f, k_nan, k_inf}) {
      CAPTURE(v);
      rejects("temperature", [v](sampling_params& p) { p.temperature = v; });
    }
    for (float v : {-0.1f, 1.01f, k_nan}) {
      CAPTURE(v);
      rejects("top_p", [v](sampling_params& p) { p.top_p = v; });
      rejects("min_p", [v](sampling_params& p) { p.min_p = v; });
    }
    rejects("repeat_last_n", [](sampling_params& p) { p.repeat_last_n = -2; });
    for (float v : {-2.01f, 2.01f, k_nan, k_inf, -k_inf}) {
      CAPTURE(v);
      rejects("presence_penalty", [v](sampling_params& p) { p.presence_penalty = v; });
      rejects("frequency_penalty", [v](sampling_params& p) { p.frequency_penalty = v; });
    }

    // The edges of every range are accepted; a negative top_k just disables top-k.
    sampling_params edge;
    edge.temperature = 0.0f;
    edge.top_p = 0.0f;
    edge.min_p = 1.0f;
    edge.repeat_penalty = 1e-6f;
    edge.repeat_last_n = -1;
    edge.top_k = -5;
    edge.presence_penalty = -2.0f;
    edge.frequency_penalty = 2.0f;
    CHECK_NOTHROW(sampler{edge});
    edge.presence_penalty = 2.0f;
    edge.frequency_penalty = -2.0f;
    edge.top_p = 1.0f;
    edge.min_p = 0.0f;
    edge.repeat_penalty = 10.0f;
    CHECK_NOTHROW(sampler{edge});
    sampling_params no_top_k = plain_params(1.0f, 27);
    no_top_k.top_k = -1;
    sampler s(no_top_k);
    CHECK(ids_drawn(s, {0.0f, 0.0f, 0.0f}, 300) == std::set<int32_t>{0, 1, 2});
  }
}

TEST_SUITE("sampler") {
  TEST_CASE("log_probabilities: log-softmax of the raw row, the most likely first, NaN as -inf") {
    const std::vector<float> l{1.0f, 3.0f, std::nanf(""), 3.0f, -std::numeric_limits<float>::infinity(), 0.0f};
    const auto t = log_probabilities(l, 1, 3);
    double sum = 0;
    for (const float v : {1.0f, 3.0f, 3.0f, 0.0f}) sum += std::exp(static_cast<double>(v));
    CHECK(t.logprob == doctest::Approx(3.0 - std::log(sum)));
    REQUIRE(t.top.size() == 3);
    CHECK(t.top[0].first == 1);  // the tie goes to the lower id
    CHECK(t.top[1].first == 3);
    CHECK(t.top[2].first == 0);
    CHECK(t.top[0].second == doctest::Approx(t.logprob));
    CHECK(std::isinf(log_probabilities(l, 2, 0).logprob));  // the NaN's
    CHECK(std::isinf(log_probabilities(l, 4, 0).logprob));
    CHECK(log_probabilities(l, 0, 0).top.empty());
    CHECK(log_probabilities(l, 0, 100).top.size() == l.size());  // never more than the vocabulary
    // Every row probability sums to one.
    double total = 0;
    for (const auto& [id, lp] : log_probabilities(l, 0, static_cast<int>(l.size())).top) total += std::exp(static_cast<double>(lp));
    CHECK(total == doctest::Approx(1.0));
  }
}
