// The CUDA backend's memory side on a real device: regions per tier, copies in both
// directions and their order, the arbiter's stage / load / stream / evict, and KV swaps, all
// through cudaMemcpyAsync on the copy streams. Suites named "gpu*" run as their own CTest entry
// (memory_gpu), which reports "skipped" (exit 77) where no device answers; run any other way
// they pass with a message saying they were skipped.
#include "memory/cuda_backend.h"

#include <doctest/doctest.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <vector>

#include "memory/arbiter.h"
#include "memory/kv_pool.h"

using namespace tandem::memory;

namespace {

// The backend, or null after saying why there is none. Under CTest's memory_gpu entry
// (TANDEM_GPU_ENTRY set) the process exits 77 instead, which CTest reports as skipped.
std::unique_ptr<backend> cuda_or_skip() {
  std::string why;
  auto b = make_cuda_backend(&why);
  if (b) return b;
  if (std::getenv("TANDEM_GPU_ENTRY")) {
    std::cerr << "SKIPPED: " << why << "\n";
    std::exit(77);
  }
  MESSAGE("skipped: " << why);
  return nullptr;
}

unsigned char pattern(int seg, size_t i) { return static_cast<unsigned char>((i * 131 + static_cast<size_t>(seg) * 17 + i / 4096) & 0xFF); }

// Device bytes read back through the device -> host stream.
std::vector<unsigned char> read_back(backend& b, const std::byte* dev, size_t bytes) {
  std::vector<unsigned char> out(bytes);
  b.copy(copy_kind::device_to_host, out.data(), dev, bytes).wait();
  return out;
}

}  // namespace

TEST_SUITE("gpu_cuda_backend") {
  TEST_CASE("regions per tier; copies land in order in both directions") {
    auto b = cuda_or_skip();
    if (!b) return;
    const auto info = b->info();
    MESSAGE("backend: " << info.name << ", " << info.device_bytes / (1 << 20) << " MiB");
    CHECK(info.name.rfind("cuda:0", 0) == 0);
    CHECK_FALSE(info.simulated);
    CHECK(info.device_bytes > 0);
    CHECK_FALSE(b->device_host_addressable());
    constexpr size_t n = size_t{64} << 20;
    auto dev = b->allocate(tier::device, n);
    auto host = b->allocate(tier::host, 2 * n);
    CHECK(dev->where() == tier::device);
    CHECK(host->where() == tier::host);
    CHECK_THROWS_AS(b->allocate(tier::disk, 10), std::invalid_argument);
    auto* h = reinterpret_cast<unsigned char*>(host->data());
    for (size_t i = 0; i < n; ++i) h[i] = pattern(0, i);
    b->copy(copy_kind::host_to_device, dev->data(), h, n);
    std::memset(h + 4096, 0xAB, 4096);
    const event last = b->copy(copy_kind::host_to_device, dev->data() + 4096, h + 4096, 4096);
    last.wait();
    b->copy(copy_kind::device_to_host, h + n, dev->data(), n).wait();
    CHECK(h[n + 4096 + 7] == 0xAB);
    size_t wrong = 0;
    for (size_t i = 0; i < n; ++i)
      if (i / 4096 != 1 && h[n + i] != pattern(0, i)) ++wrong;
    CHECK(wrong == 0);
    b->synchronize();

    // Pinned host -> device speed, for the log (the GPU check script reports it properly).
    const auto t0 = std::chrono::steady_clock::now();
    event e;
    for (int r = 0; r < 8; ++r) e = b->copy(copy_kind::host_to_device, dev->data(), h, n);
    e.wait();
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    MESSAGE("pinned host -> device: " << 8.0 * static_cast<double>(n) / s / 1e9 << " GB/s");
  }

  TEST_CASE("the arbiter over CUDA: segments reach the device through the host tier, stream through slots, leave") {
    auto b = cuda_or_skip();
    if (!b) return;
    arbiter a(*b, {256 << 20, 256 << 20});
    std::vector<segment_source> segs;
    const size_t sizes[] = {1 << 20, 5 << 20, (3 << 20) + 123, 9 << 20, 4096, 2 << 20};
    for (int s = 0; s < 6; ++s)
      segs.push_back({"seg" + std::to_string(s), sizes[s], [s, bytes = sizes[s]](std::byte* dst) {
                        for (size_t i = 0; i < bytes; ++i) dst[i] = static_cast<std::byte>(pattern(s, i));
                      }});
    const model_id m = a.add_model("m", segs);
    auto r = a.load(m);
    REQUIRE(r.st == status::ok);
    r.done.wait();
    for (int s = 0; s < 6; ++s) {
      CAPTURE(s);
      CHECK(a.residency_of(m, s, tier::device) == residency::resident);
      CHECK(a.residency_of(m, s, tier::host) == residency::resident);  // filled there on the way
      auto lease = a.acquire(m, s);
      REQUIRE(lease);
      const auto got = read_back(*b, lease.data(), sizes[s]);
      size_t wrong = 0;
      for (size_t i = 0; i < sizes[s]; ++i) wrong += got[i] != pattern(s, i);
      CHECK(wrong == 0);
    }
    a.check_integrity();
    REQUIRE(a.evict(m, tier::device) == status::ok);
    REQUIRE(a.reserve_stream_slots(m, 2) == status::ok);
    for (const int s : {3, 1, 5}) {
      CAPTURE(s);
      REQUIRE(a.prefetch(m, s) == status::ok);
      auto lease = a.acquire(m, s);
      REQUIRE(lease);
      const auto got = read_back(*b, lease.data(), sizes[s]);
      size_t wrong = 0;
      for (size_t i = 0; i < sizes[s]; ++i) wrong += got[i] != pattern(s, i);
      CHECK(wrong == 0);
      CHECK(a.residency_of(m, s, tier::device) == residency::absent);  // only in a slot
    }
    a.check_integrity();
    REQUIRE(a.reserve_stream_slots(m, 0) == status::ok);
    REQUIRE(a.evict(m, tier::host) == status::ok);
    CHECK(a.snapshot().device.used == 0);
    CHECK(a.snapshot().host.used == 0);
    a.remove_model(m);
    a.check_integrity();
  }

  TEST_CASE("KV blocks swap out to pinned host memory and back unchanged") {
    auto b = cuda_or_skip();
    if (!b) return;
    arbiter a(*b, {64 << 20, 64 << 20});
    constexpr size_t block = 64 << 10;
    auto pool = kv_pool::make(a, "m", 8, 16, block);
    REQUIRE(pool);
    REQUIRE(pool->reserve(0, 40) == status::ok);  // 3 blocks
    REQUIRE(pool->reserve(1, 16) == status::ok);
    const auto table = pool->table(0);
    REQUIRE(table.size() == 3);
    std::vector<unsigned char> src(block);
    for (size_t k = 0; k < table.size(); ++k) {
      for (size_t i = 0; i < block; ++i) src[i] = pattern(static_cast<int>(k), i);
      b->copy(copy_kind::host_to_device, pool->data() + static_cast<size_t>(table[k]) * block, src.data(), block).wait();
    }
    REQUIRE(pool->swap_out(0) == status::ok);
    CHECK(pool->swapped_out(0));
    CHECK(pool->free_blocks() == 7);
    REQUIRE(pool->reserve(2, 32) == status::ok);  // reuse the freed blocks meanwhile
    pool->drop(2);
    REQUIRE(pool->swap_in(0) == status::ok);
    const auto back = pool->table(0);
    REQUIRE(back.size() == 3);
    for (size_t k = 0; k < back.size(); ++k) {
      const auto got = read_back(*b, pool->data() + static_cast<size_t>(back[k]) * block, block);
      size_t wrong = 0;
      for (size_t i = 0; i < block; ++i) wrong += got[i] != pattern(static_cast<int>(k), i);
      CHECK(wrong == 0);
    }
    pool->drop(0);
    pool->drop(1);
    pool.reset();
    CHECK(a.snapshot().device.used == 0);
    CHECK(a.snapshot().host.used == 0);
    a.check_integrity();
  }
}
