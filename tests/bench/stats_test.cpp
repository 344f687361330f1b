// bench/stats: median and spread of repeated measurements.
#include "bench/stats.h"

#include <doctest/doctest.h>

#include <vector>

using namespace tandem::bench;

TEST_SUITE("bench_stats") {
  TEST_CASE("odd count: the middle value, whatever the order") {
    const std::vector<double> v{5, 1, 4, 2, 3};
    const auto s = summarize(v);
    CHECK(s.count == 5);
    CHECK(s.median == 3);
    CHECK(s.min == 1);
    CHECK(s.max == 5);
    CHECK(s.spread() == doctest::Approx(4.0 / 3.0));
    CHECK(v == std::vector<double>{5, 1, 4, 2, 3});  // the caller's order is kept
  }

  TEST_CASE("even count: the mean of the two middle values") {
    const std::vector<double> v{10, 40, 20, 30};
    const auto s = summarize(v);
    CHECK(s.count == 4);
    CHECK(s.median == 25);
    CHECK(s.min == 10);
    CHECK(s.max == 40);
    CHECK(s.spread() == doctest::Approx(30.0 / 25.0));
  }

  TEST_CASE("one sample has no spread; none gives zeros") {
    const std::vector<double> one{7.5};
    const auto s = summarize(one);
    CHECK(s.count == 1);
    CHECK(s.median == 7.5);
    CHECK(s.min == 7.5);
    CHECK(s.max == 7.5);
    CHECK(s.spread() == 0);
    const auto e = summarize({});
    CHECK(e.count == 0);
    CHECK(e.median == 0);
    CHECK(e.spread() == 0);
  }

  TEST_CASE("a median of zero gives a zero spread, not a division by zero") {
    const std::vector<double> v{-1, 0, 1};
    const auto s = summarize(v);
    CHECK(s.median == 0);
    CHECK(s.spread() == 0);
  }
}
