#include "runtime/prefix_cache.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "memory/arbiter.h"
#include "memory/cpu_backend.h"

using namespace tandem;

namespace {

constexpr size_t k_block = 64 << 10;  // one arbiter block per KV block

void fill_block(memory::kv_pool& kv, int32_t b, unsigned char v) { std::memset(kv.data() + static_cast<size_t>(b) * k_block, v, k_block); }
bool block_is(const memory::kv_pool& kv, int32_t b, unsigned char v) {
  const auto* p = reinterpret_cast<const unsigned char*>(kv.data()) + static_cast<size_t>(b) * k_block;
  return std::all_of(p, p + k_block, [v](unsigned char x) { return x == v; });
}

}  // namespace

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

  TEST_CASE("under pressure blocks spill to the host; a hit copies them back unchanged") {
    auto backend = memory::make_cpu_backend();
    memory::arbiter a(*backend, {8 * k_block, 8 * k_block});
    auto kv = memory::kv_pool::make(a, "m", 6, 16, k_block);
    REQUIRE(kv);
    {
      runtime::prefix_cache c(*kv);
      std::vector<int32_t> t(65);
      for (int i = 0; i < 65; ++i) t[static_cast<size_t>(i)] = i;
      REQUIRE(kv->reserve(1, 65) == memory::status::ok);  // 5 blocks, 4 full
      const auto blocks = kv->table(1);
      for (size_t i = 0; i < blocks.size(); ++i) fill_block(*kv, blocks[i], static_cast<unsigned char>(10 + i));
      c.insert(t, blocks);
      kv->drop(1);
      CHECK(c.blocks() == 4);
      CHECK(c.evict(6) == 4);  // deepest first, all of them to the host
      CHECK(c.blocks() == 0);
      CHECK(c.host_blocks() == 4);
      CHECK(kv->free_blocks() == 6);
      // Another sequence overwrites every device block meanwhile.
      REQUIRE(kv->reserve(2, 96) == memory::status::ok);
      for (const int32_t b : kv->table(2)) fill_block(*kv, b, 0xEE);
      kv->drop(2);
      const auto back = c.match(t);
      REQUIRE(back.size() == 4);
      for (size_t i = 0; i < back.size(); ++i) CHECK(block_is(*kv, back[i], static_cast<unsigned char>(10 + i)));
      CHECK(c.restored() == 4);
      CHECK(c.blocks() == 4);
      CHECK(c.host_blocks() == 0);
      kv->check();
      a.check_integrity();
      // Copies on the host give way to whoever needs the host tier.
      c.evict(6);
      CHECK(c.host_blocks() == 4);
      CHECK(c.drop_host(3) == 3);
      CHECK(c.host_blocks() == 1);
      CHECK(c.match(t).size() == 1);  // the first block is what is left
      a.check_integrity();
    }
    kv->check();
    CHECK(kv->free_blocks() == 6);
    CHECK(a.snapshot().host.used == 0);  // the cache's host copies went with it
  }

  TEST_CASE("host copies are capped; without room the deepest blocks are dropped, not kept") {
    auto backend = memory::make_cpu_backend();
    memory::arbiter a(*backend, {8 * k_block, 2 * k_block});  // two blocks of host tier
    auto kv = memory::kv_pool::make(a, "m", 6, 16, k_block);
    REQUIRE(kv);
    for (const int32_t cap : {0, 1, 100}) {
      CAPTURE(cap);
      runtime::prefix_cache c(*kv, cap);
      std::vector<int32_t> t(65, 3);
      for (int i = 0; i < 65; ++i) t[static_cast<size_t>(i)] = i * 7;
      REQUIRE(kv->reserve(1, 65) == memory::status::ok);
      c.insert(t, kv->table(1));
      kv->drop(1);
      CHECK(c.evict(6) == 4);
      CHECK(kv->free_blocks() == 6);
      CHECK(c.host_blocks() == std::min(cap, 2));  // the cap, or what the host tier holds
      // What is left is the start of the prompt: a match restores it.
      CHECK(c.match(t).size() == static_cast<size_t>(std::min(cap, 2)));
      kv->check();
      a.check_integrity();
    }
    CHECK(a.snapshot().host.used == 0);
  }
}
