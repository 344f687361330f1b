#include "configs/duration.h"

#include <doctest/doctest.h>

using namespace tandem::configs;
using namespace std::chrono_literals;

TEST_SUITE("duration") {
  TEST_CASE("units and bare seconds") {
    CHECK(parse_duration("500ms") == 500ms);
    CHECK(parse_duration("45s") == 45s);
    CHECK(parse_duration("30m") == 30min);
    CHECK(parse_duration("30min") == 30min);
    CHECK(parse_duration("2h") == 2h);
    CHECK(parse_duration("1d") == 24h);
    CHECK(parse_duration("300") == 300s);
    CHECK(parse_duration("1.5") == 1500ms);
    CHECK(parse_duration("0") == 0ms);
  }
  TEST_CASE("nonsense is refused") {
    for (const char* bad : {"", "-1", "5 parsecs", "m", "1.2.3s", "1e3s", "999999999999d"}) {
      CAPTURE(bad);
      CHECK_FALSE(parse_duration(bad).has_value());
    }
  }
  TEST_CASE("formatting picks the largest exact unit") {
    CHECK(format_duration(90s) == "90s");
    CHECK(format_duration(30min) == "30m");
    CHECK(format_duration(2h) == "2h");
    CHECK(format_duration(1500ms) == "1500ms");
    CHECK(format_duration(0ms) == "0s");
  }
}
