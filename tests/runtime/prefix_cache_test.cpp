#include "runtime/prefix_cache.h"

#include <doctest/doctest.h>

#include <vector>

using namespace tandem;

TEST_SUITE("prefix_cache") {
  TEST_CASE("insert, match whole blocks leaving one token, evict least recently used leaves") {
    std::vector<std::byte> mem(16 * 64);
    memory::kv_pool kv(mem.data(), 16, 16, 64);
    runtime::prefix_cache c(kv);
    std::vector<int32_t> a(50), b(50);
    for (int i = 0; i < 50; ++i) {
      a[static_cast<size_t>(i)] = i;
      b[static_cast<size_t>(i)] = i < 32 ? i : 1000 + i;  // shares two blocks with a
    }
    REQUIRE(kv.reserve(1, 50) == memory::status::ok);  // 4 blocks
    c.insert(a, kv.table(1));                          // 3 full blocks kept
    const auto a_blocks = kv.table(1);
    kv.drop(1);
    CHECK(c.blocks() == 3);
    CHECK(kv.free_blocks() == 16 - 3);
    kv.check();
    // b matches a's first two blocks; a (50 tokens) its three (48 cached, 2 left to evaluate);
    // a 48-token prompt only two (one token must be left to evaluate).
    CHECK(c.match(b) == std::vector<int32_t>{a_blocks[0], a_blocks[1]});
    CHECK(c.match(a) == std::vector<int32_t>{a_blocks[0], a_blocks[1], a_blocks[2]});
    CHECK(c.match(std::span<const int32_t>(a.data(), 48)).size() == 2);
    CHECK(c.match(std::vector<int32_t>{7, 7, 7}).empty());
    CHECK(c.hits() == 3);
    CHECK(c.misses() == 1);
    // Blocks a sequence shares are not released (that would free nothing); the rest are.
    kv.adopt(2, c.match(b));
    CHECK(c.evict(16) == 1);  // a's third block; its first two are b's too
    CHECK(c.blocks() == 2);
    kv.drop(2);
    CHECK(c.evict(16) == 2);
    CHECK(c.blocks() == 0);
    CHECK(kv.free_blocks() == 16);
    kv.check();
  }

  TEST_CASE("the same tokens are kept once; the destructor releases everything") {
    std::vector<std::byte> mem(8 * 64);
    memory::kv_pool kv(mem.data(), 8, 16, 64);
    {
      runtime::prefix_cache c(kv);
      std::vector<int32_t> t(33, 5);
      REQUIRE(kv.reserve(1, 33) == memory::status::ok);
      REQUIRE(kv.reserve(2, 33) == memory::status::ok);
      c.insert(t, kv.table(1));
      c.insert(t, kv.table(2));
      CHECK(c.blocks() == 2);
      kv.drop(1);
      kv.drop(2);
      kv.check();
    }
    CHECK(kv.free_blocks() == 8);
  }
}
