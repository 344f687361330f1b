#include "memory/kv_pool.h"

#include <doctest/doctest.h>

#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "memory/arbiter.h"
#include "memory/cpu_backend.h"

using namespace tandem::memory;

namespace {

void fill_seq(kv_pool& p, int64_t seq, unsigned char tag) {
  for (const int32_t b : p.table(seq)) std::memset(p.data() + static_cast<size_t>(b) * p.block_bytes(), tag + b % 7, p.block_bytes());
}

// The bytes of seq's blocks in table order.
std::vector<unsigned char> bytes_of(const kv_pool& p, int64_t seq) {
  std::vector<unsigned char> out;
  for (const int32_t b : p.table(seq)) {
    const auto* at = reinterpret_cast<const unsigned char*>(p.data() + static_cast<size_t>(b) * p.block_bytes());
    out.insert(out.end(), at, at + p.block_bytes());
  }
  return out;
}

}  // namespace

TEST_SUITE("kv_pool") {
  TEST_CASE("tables grow by whole blocks, run out with a status, share prefixes by count") {
    std::vector<std::byte> mem(8 * 256);
    kv_pool p(mem.data(), 8, 16, 256);
    CHECK(p.reserve(1, 1) == status::ok);
    CHECK(p.table(1).size() == 1);
    CHECK(p.capacity(1) == 16);
    CHECK(p.reserve(1, 40) == status::ok);
    CHECK(p.table(1).size() == 3);
    CHECK(p.reserve(2, 16 * 6) == status::no_space);  // 5 left
    CHECK(p.table(2).empty());
    CHECK(p.free_blocks() == 5);
    p.share_prefix(1, 2, 2);
    CHECK(p.refcount(p.table(1)[0]) == 2);
    CHECK(p.reserve(2, 48) == status::ok);  // one more, its own
    CHECK(p.table(2)[2] != p.table(1)[2]);
    p.drop(1);
    CHECK(p.refcount(p.table(2)[0]) == 1);
    p.check();
    p.truncate(2, 17);
    CHECK(p.table(2).size() == 2);
    p.drop(2);
    CHECK(p.free_blocks() == 8);
    p.check();
    CHECK_THROWS_AS(kv_pool(mem.data(), 8, 10, 256), std::invalid_argument);
    CHECK(p.swap_out(3) == status::not_resident);  // no arbiter, no host tier
  }

  TEST_CASE("the free queue reuses the blocks freed longest ago first") {
    std::vector<std::byte> mem(4 * 64);
    kv_pool p(mem.data(), 4, 16, 64);
    REQUIRE(p.reserve(1, 64) == status::ok);
    const auto t = p.table(1);
    p.truncate(1, 16);  // frees t[3], t[2], t[1] in that order
    REQUIRE(p.reserve(2, 16) == status::ok);
    CHECK(p.table(2)[0] == t[3]);
  }

  TEST_CASE("swap out and back in: the bytes return, the device blocks are freed meanwhile") {
    auto b = make_cpu_backend();
    arbiter a(*b, {1 << 20, 1 << 20, 4096});
    const auto base = a.snapshot();
    {
      status why = status::ok;
      auto p = kv_pool::make(a, "chat", 16, 16, 4096, &why);
      REQUIRE(p);
      CHECK(why == status::ok);
      REQUIRE(p->reserve(7, 16 * 5) == status::ok);
      REQUIRE(p->reserve(8, 16 * 3) == status::ok);
      p->share_prefix(7, 9, 2);
      fill_seq(*p, 7, 10);
      fill_seq(*p, 8, 90);
      const auto before = bytes_of(*p, 7);
      CHECK(p->swap_out(7) == status::ok);
      CHECK(p->swapped_out(7));
      CHECK(p->table(7).empty());
      CHECK(p->reserve(7, 100) == status::busy);
      CHECK(p->free_blocks() == 16 - 3 - 2);  // 9 still holds the shared two
      // Reuse the freed blocks for another sequence and scribble on them.
      REQUIRE(p->reserve(10, 16 * 11) == status::ok);
      fill_seq(*p, 10, 200);
      CHECK(p->swap_in(7) == status::no_space);
      p->drop(10);
      CHECK(p->swap_in(7) == status::ok);
      CHECK_FALSE(p->swapped_out(7));
      CHECK(bytes_of(*p, 7) == before);
      p->check();
      a.check_integrity();
      CHECK(a.snapshot().host.used == base.host.used);
      CHECK(p->swap_out(8) == status::ok);
    }  // the pool returns its device memory and the swapped copy of 8
    CHECK(a.snapshot().device.used == base.device.used);
    CHECK(a.snapshot().host.used == base.host.used);
    {
      auto p = kv_pool::make(a, "empty", 2, 16, 4096);
      REQUIRE(p);
      CHECK(p->swap_out(42) == status::ok);  // no blocks: nothing to move, not marked swapped
      CHECK_FALSE(p->swapped_out(42));
      CHECK(p->reserve(42, 16) == status::ok);
    }
    status why = status::ok;
    CHECK_FALSE(kv_pool::make(a, "huge", 1000, 16, 4096, &why));
    CHECK(why == status::no_space);
  }

  TEST_CASE("randomized: reserve, truncate, share, drop and swap keep the counts exact") {
    auto b = make_cpu_backend();
    arbiter a(*b, {1 << 20, 256 << 10, 4096});
    std::mt19937_64 rng(99);
    auto p = kv_pool::make(a, "m", 64, 16, 4096);
    REQUIRE(p);
    for (int step = 0; step < 3000; ++step) {
      const int64_t seq = static_cast<int64_t>(rng() % 8);
      switch (rng() % 6) {
        case 0:
          p->reserve(seq, static_cast<int64_t>(rng() % 200));
          break;
        case 1:
          p->truncate(seq, static_cast<int64_t>(rng() % 100));
          break;
        case 2:
          p->drop(seq);
          break;
        case 3: {
          const int64_t to = static_cast<int64_t>(rng() % 8);
          if (to != seq && p->table(to).empty() && !p->swapped_out(to) && !p->table(seq).empty())
            p->share_prefix(seq, to, static_cast<int32_t>(rng() % (p->table(seq).size() + 1)));
          break;
        }
        case 4:
          p->swap_out(seq);
          break;
        case 5:
          p->swap_in(seq);
          break;
      }
      p->check();
      a.check_integrity();
    }
    for (int64_t s = 0; s < 8; ++s) p->drop(s);
    CHECK(p->free_blocks() == 64);
    CHECK(a.snapshot().host.used == 0);
  }
}
