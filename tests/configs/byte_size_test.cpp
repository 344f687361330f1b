#include "configs/byte_size.h"

#include <doctest/doctest.h>

using namespace tandem::configs;

TEST_SUITE("byte_size") {
  TEST_CASE("units: binary, decimal, bare numbers") {
    CHECK(parse_byte_size("4096") == 4096u);
    CHECK(parse_byte_size("22GiB") == 22ull << 30);
    CHECK(parse_byte_size("512MiB") == 512ull << 20);
    CHECK(parse_byte_size("512 MiB") == 512ull << 20);
    CHECK(parse_byte_size("1.5GB") == 1500000000u);
    CHECK(parse_byte_size("2G") == 2ull << 30);
    CHECK(parse_byte_size("64K") == 65536u);
    CHECK(parse_byte_size("10kB") == 10000u);
    CHECK(parse_byte_size(" 3B ") == 3u);
    CHECK(parse_byte_size("0") == 0u);
  }
  TEST_CASE("nonsense is refused") {
    for (const char* bad : {"", "GiB", "-1GiB", "1.2.3G", "12 parsecs", "1e3", "nan", ".", "99999999999999999999999TiB", "5mb", "3gib"}) {
      CAPTURE(bad);
      CHECK_FALSE(parse_byte_size(bad).has_value());
    }
  }
  TEST_CASE("formatting picks the largest unit") {
    CHECK(format_byte_size(100) == "100 B");
    CHECK(format_byte_size(1536) == "1.5 KiB");
    CHECK(format_byte_size(22ull << 30) == "22.0 GiB");
  }
}
