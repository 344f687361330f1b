#include "memory/arbiter.h"

#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include "memory/cpu_backend.h"

using namespace tandem::memory;

namespace {

// prefix + i, appended (GCC 12 warns falsely about "literal" + std::string).
std::string label(const char* prefix, size_t i) {
  std::string s = prefix;
  s += std::to_string(i);
  return s;
}

// Segment i of model `tag` holds bytes (tag * 31 + i * 7 + k) & 0xff at position k, so any
// copy that lands in the wrong place or is torn shows.
std::vector<segment_source> segments(int tag, const std::vector<uint64_t>& sizes, std::atomic<int>* fills = nullptr) {
  std::vector<segment_source> out;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const uint64_t n = sizes[i];
    out.push_back({label("seg", i), n, [tag, i, n, fills](std::byte* dst) {
                     for (uint64_t k = 0; k < n; ++k)
                       dst[k] = static_cast<std::byte>((tag * 31 + static_cast<int>(i) * 7 + static_cast<int>(k)) & 0xff);
                     if (fills) ++*fills;
                   }});
  }
  return out;
}

bool holds_segment(const std::byte* p, int tag, int i, uint64_t n) {
  for (uint64_t k = 0; k < n; ++k)
    if (p[k] != static_cast<std::byte>((tag * 31 + i * 7 + static_cast<int>(k)) & 0xff)) return false;
  return true;
}

// The CPU backend claiming, as a GPU's does, that the host cannot write its device tier: the
// arbiter must then never fill device memory in place, while the test can still read it.
class opaque_device_backend final : public backend {
 public:
  opaque_device_backend() : inner_(make_cpu_backend()) {}
  backend_info info() const override { return inner_->info(); }
  std::unique_ptr<region> allocate(tier t, size_t bytes) override { return inner_->allocate(t, bytes); }
  bool device_host_addressable() const override { return false; }
  event copy(copy_kind kind, void* dst, const void* src, size_t bytes) override {
    ++copies;
    return inner_->copy(kind, dst, src, bytes);
  }
  void synchronize() override { inner_->synchronize(); }
  std::atomic<int> copies{0};

 private:
  std::unique_ptr<backend> inner_;
};

}  // namespace

TEST_SUITE("arbiter") {
  TEST_CASE("a device the host cannot write, and no host room: loads and stream slots fill through a transient buffer") {
    opaque_device_backend b;
    arbiter a(b, {1 << 20, 4096, 4096});  // one block of host tier: room for no segment
    const auto m = a.add_model("m", segments(5, {9000, 7000, 8000}));
    auto ld = a.load(m, {0, 2});
    REQUIRE(ld.st == status::ok);
    ld.done.wait();
    CHECK(b.copies == 2);  // each segment copied to the device, none filled in place
    CHECK(a.residency_of(m, 0, tier::host) == residency::absent);
    for (int i = 0; i < 2; ++i) {
      auto l = a.acquire(m, i);
      REQUIRE(l);
      CHECK(holds_segment(l.data(), 5, i, i == 0 ? 9000 : 7000));
    }
    REQUIRE(a.reserve_stream_slots(m, 1) == status::ok);
    {
      auto l = a.acquire(m, 2);  // through the slot, with no host copy to copy from
      REQUIRE(l);
      CHECK(holds_segment(l.data(), 5, 2, 8000));
    }
    CHECK(b.copies == 3);
    a.check_integrity();
  }

  TEST_CASE("stage, load, lease, evict: bytes land where the lease says, owners add up") {
    auto b = make_cpu_backend();
    arbiter a(*b, {1 << 20, 1 << 20, 4096});
    std::atomic<int> fills{0};
    const model_id m = a.add_model("chat", segments(1, {10000, 5000, 3000}, &fills));
    CHECK(a.segment_count(m) == 3);
    CHECK(a.residency_of(m, 0, tier::device) == residency::absent);
    CHECK(a.residency_of(m, 0, tier::disk) == residency::resident);

    auto st = a.stage(m);
    REQUIRE(st.st == status::ok);
    st.done.wait();
    CHECK(fills == 3);
    auto ld = a.load(m, {1, 2});
    REQUIRE(ld.st == status::ok);
    ld.done.wait();
    CHECK(fills == 3);  // from the host copies, not refilled
    CHECK(a.residency_of(m, 1, tier::device) == residency::resident);
    CHECK(a.residency_of(m, 0, tier::device) == residency::absent);

    {
      status why = status::ok;
      auto none = a.acquire(m, 0, &why);
      CHECK_FALSE(none);
      CHECK(why == status::not_resident);
      auto l = a.acquire(m, 2);
      REQUIRE(l);
      CHECK(l.bytes() == 3000);
      CHECK(holds_segment(l.data(), 1, 2, 3000));
      CHECK(a.evict(m, tier::device, {2, 1}) == status::busy);  // leased
      CHECK(a.evict(m, tier::host) == status::ok);              // host copies may go
      a.check_integrity();
    }
    const auto snap = a.snapshot();
    CHECK(snap.device.used == 4096 * (2 + 1));  // 5000 -> 2 blocks, 3000 -> 1
    CHECK(snap.host.used == 0);
    REQUIRE(snap.models.size() == 1);
    CHECK(snap.models[0].segments[1].device == residency::resident);
    CHECK(snap.owners.size() == 2);
    CHECK(a.evict(m, tier::device) == status::ok);
    CHECK(a.snapshot().device.used == 0);
    // Loading without a host copy fills the device straight from disk (CPU backend).
    ld = a.load(m, {0, 1});
    REQUIRE(ld.st == status::ok);
    ld.done.wait();
    CHECK(fills == 4);
    a.check_integrity();
    a.remove_model(m);
    CHECK(a.snapshot().device.used == 0);
    CHECK_THROWS_AS(a.stage(m), std::invalid_argument);
  }

  TEST_CASE("no space is a status, all or nothing; misuse throws") {
    auto b = make_cpu_backend();
    arbiter a(*b, {64 << 10, 16 << 10, 4096});
    const model_id m = a.add_model("big", segments(2, {40000, 40000}));
    CHECK(a.stage(m).st == status::no_space);
    CHECK(a.snapshot().host.used == 0);
    CHECK(a.load(m).st == status::no_space);
    CHECK(a.snapshot().device.used == 0);
    CHECK(a.load(m, {0, 1}).st == status::ok);
    CHECK_THROWS_AS(a.add_model("big", segments(3, {10})), std::invalid_argument);
    CHECK_THROWS_AS(a.load(m, {1, 5}), std::out_of_range);
    CHECK_THROWS_AS(a.evict(m, tier::disk), std::invalid_argument);
    const auto kv = a.allocate(tier::device, 100000, {owner_kind::kv, "big", ""});
    CHECK_FALSE(kv);  // 40000 of 64 KiB are taken
    const auto small = a.allocate(tier::device, 8000, {owner_kind::kv, "big", ""});
    REQUIRE(small);
    CHECK(small->bytes == 8192);
    a.release(*small);
    CHECK_THROWS_AS(a.release(*small), std::logic_error);
    {
      auto l = a.acquire(m, 0);
      REQUIRE(l);
      CHECK_THROWS_AS(a.remove_model(m), std::logic_error);
    }
    a.remove_model(m);
    a.check_integrity();
  }

  TEST_CASE("stream slots bring segments that are not resident, least recently used first") {
    auto b = make_cpu_backend();
    arbiter a(*b, {64 << 10, 1 << 20, 4096});
    std::atomic<int> fills{0};
    const model_id m = a.add_model("streamed", segments(4, {20000, 10000, 20000, 15000, 20000}, &fills));
    REQUIRE(a.stage(m).st == status::ok);
    CHECK(a.reserve_stream_slots(m, 2) == status::ok);  // 2 x 20480 of 64 KiB
    CHECK(a.reserve_stream_slots(m, 4) == status::no_space);
    CHECK(a.reserve_stream_slots(m, 2) == status::ok);
    for (int round = 0; round < 3; ++round)
      for (int i = 0; i < 5; ++i) {
        auto l = a.acquire(m, i);
        REQUIRE(l);
        CHECK(holds_segment(l.data(), 4, i, a.segment_bytes(m, i)));
        if (i + 1 < 5) CHECK(a.prefetch(m, i + 1) == status::ok);
        a.check_integrity();
      }
    {
      auto l0 = a.acquire(m, 0);
      auto l1 = a.acquire(m, 1);
      status why = status::ok;
      auto l2 = a.acquire(m, 2, &why);  // both slots leased
      CHECK_FALSE(l2);
      CHECK(why == status::busy);
      CHECK(a.reserve_stream_slots(m, 0) == status::busy);
    }
    CHECK(fills == 5);  // every pass copied from the host copies
    CHECK(a.reserve_stream_slots(m, 0) == status::ok);
    a.remove_model(m);
    CHECK(a.snapshot().device.used == 0);
    CHECK(a.snapshot().host.used == 0);
  }

  TEST_CASE("a fill that fails fails its events; the books stay exact") {
    auto b = make_cpu_backend();
    arbiter a(*b, {1 << 20, 1 << 20, 4096});
    std::vector<segment_source> segs = segments(5, {5000, 5000});
    segs[1].fill = [](std::byte*) { throw std::runtime_error("disk read error"); };
    const model_id m = a.add_model("broken", std::move(segs));
    const auto st = a.stage(m);
    REQUIRE(st.st == status::ok);
    CHECK_THROWS_WITH_AS(st.done.wait(), "disk read error", std::runtime_error);
    const auto ld = a.load(m, {1, 1});  // from the failed host copy: fails too, never hangs
    REQUIRE(ld.st == status::ok);
    CHECK_THROWS_AS(ld.done.wait(), std::runtime_error);
    a.check_integrity();
    CHECK(a.evict(m, tier::device) == status::ok);
    CHECK(a.evict(m, tier::host) == status::ok);
    a.remove_model(m);
    CHECK(a.snapshot().host.used == 0);
  }

  TEST_CASE("randomized: thousands of operations keep the books exact") {
    std::mt19937_64 rng(20261129);
    for (int trial = 0; trial < 4; ++trial) {
      auto b = make_cpu_backend();
      const uint64_t dev = (64 + rng() % 512) << 10, host = (rng() % 768) << 10;
      arbiter a(*b, {dev, host, size_t{4096} << (rng() % 3)});
      const auto base = a.snapshot();
      std::vector<model_id> models;
      std::vector<int> tags;
      for (int i = 0; i < 3; ++i) {
        std::vector<uint64_t> sizes;
        const int n = 1 + static_cast<int>(rng() % 6);
        for (int s = 0; s < n; ++s) sizes.push_back(1 + rng() % 60000);
        models.push_back(a.add_model(label("m", static_cast<size_t>(i)), segments(10 + i, sizes)));
        tags.push_back(10 + i);
      }
      std::vector<residency_lease> leases;
      std::vector<allocation> allocs;
      for (int step = 0; step < 1500; ++step) {
        const size_t mi = rng() % models.size();
        const model_id m = models[mi];
        const int nseg = a.segment_count(m);
        const int first = static_cast<int>(rng() % static_cast<uint64_t>(nseg));
        const segment_range r{first, 1 + static_cast<int>(rng() % static_cast<uint64_t>(nseg - first))};
        switch (rng() % 10) {
          case 0:
            a.stage(m, r);
            break;
          case 1:
            a.load(m, r);
            break;
          case 2:
            a.evict(m, tier::device, r);
            break;
          case 3:
            a.evict(m, tier::host, r);
            break;
          case 4: {
            if (leases.size() > 6) break;
            status why = status::ok;
            auto l = a.acquire(m, first, &why);
            if (l) {
              CHECK(holds_segment(l.data(), tags[mi], first, l.bytes()));
              leases.push_back(std::move(l));
            } else {
              CHECK((why == status::not_resident || why == status::busy));
            }
            break;
          }
          case 5:
            if (!leases.empty()) leases.erase(leases.begin() + static_cast<long>(rng() % leases.size()));
            break;
          case 6: {
            const tier t = rng() % 2 ? tier::device : tier::host;
            if (auto al = a.allocate(t, 1 + rng() % 40000, {owner_kind::kv, label("m", mi), ""})) allocs.push_back(*al);
            break;
          }
          case 7:
            if (!allocs.empty()) {
              const size_t k = rng() % allocs.size();
              a.release(allocs[k]);
              allocs.erase(allocs.begin() + static_cast<long>(k));
            }
            break;
          case 8:
            a.reserve_stream_slots(m, static_cast<int>(rng() % 3));
            break;
          case 9:
            a.prefetch(m, first);
            break;
        }
        a.check_integrity();
      }
      leases.clear();
      for (const auto& al : allocs) a.release(al);
      for (const model_id m : models) {
        a.wait_idle(m);
        CHECK(a.reserve_stream_slots(m, 0) == status::ok);
        CHECK(a.evict(m, tier::device) == status::ok);
        CHECK(a.evict(m, tier::host) == status::ok);
      }
      a.check_integrity();
      const auto end = a.snapshot();
      CHECK(end.device.used == base.device.used);
      CHECK(end.host.used == base.host.used);
      CHECK(end.copies_in_flight == 0);
      for (const model_id m : models) a.remove_model(m);
    }
  }
}
