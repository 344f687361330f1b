#include "memory/kv_pool.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <stdexcept>
#include <vector>

#include "memory/arbiter.h"
#include "memory/cpu_backend.h"

using namespace tandem::memory;

namespace {

void fill_seq(kv_pool& p, int64_t seq, unsigned char tag) {
  for (const int32_t b : p.table(seq)) std::memset(p.data() + static_cast<size_t>(b) * p.block_stride(), tag + b % 7, p.block_bytes());
}

// The bytes of seq's blocks in table order.
std::vector<unsigned char> bytes_of(const kv_pool& p, int64_t seq) {
  std::vector<unsigned char> out;
  for (const int32_t b : p.table(seq)) {
    const auto* at = reinterpret_cast<const unsigned char*>(p.data() + static_cast<size_t>(b) * p.block_stride());
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

  TEST_CASE("randomized: reserve, truncate, share, drop and swap keep the counts exact (fixed, and elastic pools sharing a tier)") {
    bool elastic = false;
    SUBCASE("fixed") { elastic = false; }
    SUBCASE("elastic") { elastic = true; }
    CAPTURE(elastic);
    auto b = make_cpu_backend();
    // Elastic: two models' pools over a device tier with room for 48 of their 64 + 64 blocks.
    arbiter a(*b, {elastic ? size_t{48} * 4096 : size_t{1} << 20, 256 << 10, 4096});
    std::mt19937_64 rng(99);
    auto p = elastic ? kv_pool::make_elastic(a, "m", 64, 4, 16, 4096) : kv_pool::make(a, "m", 64, 16, 4096);
    auto other = elastic ? kv_pool::make_elastic(a, "other", 64, 0, 16, 4000) : nullptr;
    REQUIRE(p);
    for (int step = 0; step < 3000; ++step) {
      const int64_t seq = static_cast<int64_t>(rng() % 8);
      if (other && rng() % 4 == 0) {
        if (rng() % 2)
          other->reserve(seq, static_cast<int64_t>(rng() % 300));
        else
          other->drop(seq);
        other->check();
      }
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
    if (other)
      for (int64_t s = 0; s < 8; ++s) other->drop(s);
    CHECK(p->free_blocks() == (elastic ? 48 : 64));  // elastic: what the tier holds, within the limit
    CHECK(p->device_blocks() == (elastic ? 4 : 64));
    CHECK(a.snapshot().host.used == 0);
  }

  TEST_CASE("an elastic pool takes blocks from the device tier as sequences grow and gives them back as they end") {
    auto b = make_cpu_backend();
    arbiter a(*b, {size_t{1} << 20, size_t{1} << 20, 4096});
    const uint64_t base = a.snapshot().device.used;
    status why = status::no_space;
    auto p = kv_pool::make_elastic(a, "chat", 20, 2, 16, 5000, &why);
    REQUIRE(p);
    CHECK(why == status::ok);
    CHECK(p->elastic());
    CHECK(p->block_stride() == 4096);
    CHECK(p->block_footprint() == 8192);  // 5000 bytes in whole arbiter blocks
    CHECK(p->total_blocks() == 20);       // a limit
    CHECK(p->device_blocks() == 2);       // the floor, taken now
    CHECK(a.snapshot().device.used == base + 2 * 8192);
    auto kv_bytes = [&] {
      for (const auto& o : a.snapshot().owners)
        if (o.who == owner{owner_kind::kv, "chat", ""}) return o.device;
      return uint64_t{0};
    };
    CHECK(kv_bytes() == 2 * 8192);
    REQUIRE(p->reserve(1, 16 * 5) == status::ok);
    CHECK(p->device_blocks() == 5);
    CHECK(kv_bytes() == 5 * 8192);
    fill_seq(*p, 1, 3);
    const auto before = bytes_of(*p, 1);
    CHECK(p->reserve(2, 16 * 16) == status::no_space);  // 5 + 16 > the limit of 20
    CHECK(p->table(2).empty());
    CHECK(p->device_blocks() == 5);  // nothing kept from the refused reserve
    REQUIRE(p->reserve(2, 16 * 15) == status::ok);
    CHECK(p->free_blocks() == 0);
    p->drop(2);
    CHECK(p->device_blocks() == 5);
    // Swapped out, the blocks go back to the tier; swapped in, the bytes return.
    REQUIRE(p->swap_out(1) == status::ok);
    CHECK(p->device_blocks() == 2);
    REQUIRE(p->swap_in(1) == status::ok);
    CHECK(bytes_of(*p, 1) == before);
    // A stash comes back into a block taken for it.
    const int32_t first = p->table(1)[0];
    p->retain(first);
    const auto st = p->stash(first);
    REQUIRE(st);
    p->release_block(first);
    const auto back = p->unstash(*st);
    REQUIRE(back);
    CHECK(std::memcmp(p->data() + static_cast<size_t>(*back) * p->block_stride(), p->data() + static_cast<size_t>(first) * p->block_stride(),
                      p->block_bytes()) == 0);
    p->release_block(*back);
    p->drop_stash(*st);
    p->drop(1);
    CHECK(p->device_blocks() == 2);  // back to the floor
    p->check();
    a.check_integrity();
    p.reset();
    CHECK(a.snapshot().device.used == base);
    CHECK(a.snapshot().host.used == 0);
  }

  TEST_CASE("elastic pools share one device tier: what one gives back another can take, weights included") {
    auto b = make_cpu_backend();
    arbiter a(*b, {16 * 4096, size_t{1} << 20, 4096});
    auto chat = kv_pool::make_elastic(a, "chat", 16, 0, 16, 4096);
    auto code = kv_pool::make_elastic(a, "code", 16, 0, 16, 4096);
    REQUIRE(chat);
    REQUIRE(code);
    REQUIRE(chat->reserve(0, 16 * 16) == status::ok);  // the whole tier
    CHECK(code->free_blocks() == 0);
    CHECK(code->reserve(0, 16) == status::no_space);
    CHECK_FALSE(a.allocate(tier::device, 4096, {owner_kind::scratch, "", ""}));
    chat->truncate(0, 16 * 4);
    CHECK(code->free_blocks() == 12);
    REQUIRE(code->reserve(0, 16 * 10) == status::ok);
    const auto scratch = a.allocate(tier::device, 2 * 4096, {owner_kind::scratch, "", ""});
    REQUIRE(scratch);
    CHECK(chat->reserve(0, 16 * 5) == status::no_space);
    a.release(*scratch);
    CHECK(chat->reserve(0, 16 * 5) == status::ok);
    // Ids of both pools address the same region: no block is handed out twice.
    std::vector<int32_t> ids(chat->table(0));
    ids.insert(ids.end(), code->table(0).begin(), code->table(0).end());
    std::sort(ids.begin(), ids.end());
    CHECK(std::adjacent_find(ids.begin(), ids.end()) == ids.end());
    chat->check();
    code->check();
    a.check_integrity();
  }

  TEST_CASE("an elastic pool refuses a floor it cannot have, or one above its limit") {
    auto b = make_cpu_backend();
    arbiter a(*b, {8 * 4096, size_t{1} << 20, 4096});
    status why = status::ok;
    CHECK_FALSE(kv_pool::make_elastic(a, "big", 20, 9, 16, 4096, &why));
    CHECK(why == status::no_space);
    CHECK(a.snapshot().device.used == 0);  // nothing kept of the floor's first blocks
    CHECK_THROWS_AS(kv_pool::make_elastic(a, "m", 4, 5, 16, 4096), std::invalid_argument);
    CHECK_THROWS_AS(kv_pool::make_elastic(a, "m", 4, 0, 10, 4096), std::invalid_argument);
  }
}
