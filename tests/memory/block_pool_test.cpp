#include "memory/block_pool.h"

#include <doctest/doctest.h>

#include <map>
#include <random>
#include <stdexcept>

using tandem::memory::block_pool;

TEST_SUITE("block_pool") {
  TEST_CASE("rounds to whole blocks, first fit, coalesces on release") {
    block_pool p(10 * 4096 + 100, 4096);
    CHECK(p.capacity() == 10 * 4096);
    const auto a = p.allocate(1);
    const auto b = p.allocate(4097);
    const auto c = p.allocate(0);
    REQUIRE(a);
    REQUIRE(b);
    REQUIRE(c);
    CHECK(*a == 0);
    CHECK(*b == 4096);
    CHECK(*c == 3 * 4096);
    CHECK(p.size_at(*b) == 2 * 4096);
    CHECK(p.used() == 4 * 4096);
    p.release(*b);
    CHECK(p.largest_free() == 6 * 4096);  // the tail; the hole of 2 is smaller
    p.release(*a);
    CHECK(p.largest_free() == 6 * 4096);
    const auto d = p.allocate(3 * 4096);  // the coalesced hole before c, exactly
    REQUIRE(d);
    CHECK(*d == 0);
    p.release(*c);
    p.release(*d);
    CHECK(p.used() == 0);
    CHECK(p.largest_free() == 10 * 4096);
    p.check();
  }

  TEST_CASE("exhaustion is nullopt, misuse throws") {
    block_pool p(4 * 1024, 1024);
    CHECK_FALSE(p.allocate(5 * 1024));
    const auto a = p.allocate(4 * 1024);
    REQUIRE(a);
    CHECK_FALSE(p.allocate(1));
    CHECK_THROWS_AS(p.release(*a + 1024), std::logic_error);
    p.release(*a);
    CHECK_THROWS_AS(p.release(*a), std::logic_error);
    CHECK_THROWS_AS(block_pool(1024, 1000), std::invalid_argument);
    block_pool empty(0, 64);
    CHECK_FALSE(empty.allocate(1));
    empty.check();
  }

  TEST_CASE("random allocate / release keeps the tiling exact") {
    std::mt19937_64 rng(7);
    block_pool p(1 << 20, 256);
    std::map<size_t, size_t> live;
    for (int step = 0; step < 5000; ++step) {
      if (live.empty() || rng() % 3 != 0) {
        const size_t n = rng() % 20000;
        if (const auto at = p.allocate(n)) {
          CHECK(p.size_at(*at) >= n);
          live[*at] = n;
        }
      } else {
        auto it = live.begin();
        std::advance(it, static_cast<long>(rng() % live.size()));
        p.release(it->first);
        live.erase(it);
      }
      p.check();
    }
    for (const auto& [at, n] : live) p.release(at);
    CHECK(p.used() == 0);
    CHECK(p.largest_free() == p.capacity());
  }
}
