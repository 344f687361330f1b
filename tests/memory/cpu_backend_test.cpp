#include "memory/cpu_backend.h"

#include <doctest/doctest.h>

#include <chrono>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <vector>

#include "memory/backend.h"
#include "memory/copy_queue.h"

using namespace tandem::memory;

TEST_SUITE("cpu_backend") {
  TEST_CASE("regions per tier, copies in both directions land, in order") {
    auto b = make_cpu_backend();
    const auto info = b->info();
    CHECK(info.simulated);
    CHECK(info.link_gbps == 0);
    CHECK(b->device_host_addressable());
    auto dev = b->allocate(tier::device, 3 << 20);
    auto host = b->allocate(tier::host, 3 << 20);
    REQUIRE(dev->size() == size_t{3} << 20);
    CHECK(dev->where() == tier::device);
    CHECK(host->where() == tier::host);
    CHECK_THROWS_AS(b->allocate(tier::disk, 10), std::invalid_argument);
    auto* h = reinterpret_cast<unsigned char*>(host->data());
    auto* d = reinterpret_cast<unsigned char*>(dev->data());
    for (size_t i = 0; i < host->size(); ++i) h[i] = static_cast<unsigned char>(i * 7);
    // Two copies to the device, the second overwriting part of the first: order matters.
    const event e1 = b->copy(copy_kind::host_to_device, d, h, 2 << 20);
    std::memset(h + (1 << 20), 0xAB, 4096);
    const event e2 = b->copy(copy_kind::host_to_device, d + (1 << 20), h + (1 << 20), 4096);
    e2.wait();
    CHECK(e1.ready());
    CHECK(d[(1 << 20) + 5] == 0xAB);
    CHECK(d[17] == static_cast<unsigned char>(17 * 7));
    std::memset(h, 0, 4096);
    b->copy(copy_kind::device_to_host, h, d, 4096);
    b->synchronize();
    CHECK(h[17] == static_cast<unsigned char>(17 * 7));
  }

  TEST_CASE("a throttled link takes at least bytes / rate") {
    // A lower bound only: the copy may be slower on a busy machine, never faster.
    auto b = make_cpu_backend(1.0);  // 1 GB/s
    CHECK(b->info().link_gbps == 1.0);
    std::vector<char> src(8 << 20, 1), dst(8 << 20);
    const auto t0 = std::chrono::steady_clock::now();
    b->copy(copy_kind::host_to_device, dst.data(), src.data(), src.size()).wait();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    CHECK(s >= 0.9 * static_cast<double>(src.size()) / 1e9);
    CHECK(dst[src.size() - 1] == 1);
    CHECK_THROWS_AS(make_cpu_backend(-1), std::invalid_argument);
  }

  TEST_CASE("make_backend: cpu on request, automatic falls back to cpu without a GPU") {
    auto cpu = make_backend({backend_kind::cpu, 0});
    CHECK(cpu->info().simulated);
    auto any = make_backend({});
    CHECK_FALSE(any->info().name.empty());  // cuda on a GPU machine, cpu elsewhere
  }

  TEST_CASE("copy_queue: events complete in order, drain waits for all") {
    copy_queue q;
    std::vector<int> a(1000), b(1000);
    std::iota(a.begin(), a.end(), 0);
    std::vector<event> evs;
    for (int i = 0; i < 10; ++i) evs.push_back(q.enqueue(b.data() + i * 100, a.data() + i * 100, 100 * sizeof(int)));
    q.drain();
    for (const auto& e : evs) CHECK(e.ready());
    CHECK(b == a);
    CHECK(event{}.ready());
  }
}
