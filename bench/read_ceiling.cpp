#include "bench/read_ceiling.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <stdexcept>

#include "bench/read_kernels.h"
#include "memory/huge_buffer.h"
#include "memory/memory_limits.h"

namespace tandem::bench {
namespace detail {

uint64_t read_sum_scalar(const std::byte* data, size_t bytes) {
  // Four accumulators so the adds do not form one dependency chain.
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  size_t i = 0;
  for (; i + 32 <= bytes; i += 32) {
    uint64_t w[4];
    std::memcpy(w, data + i, 32);
    s0 += w[0], s1 += w[1], s2 += w[2], s3 += w[3];
  }
  for (; i < bytes; i += 8) {
    uint64_t w;
    std::memcpy(&w, data + i, 8);
    s0 += w;
  }
  return s0 + s1 + s2 + s3;
}

}  // namespace detail

namespace {

constexpr uint64_t k_huge_page = memory::k_huge_page;

uint64_t last_level_cache_bytes() {
  for (int name : {_SC_LEVEL4_CACHE_SIZE, _SC_LEVEL3_CACHE_SIZE, _SC_LEVEL2_CACHE_SIZE}) {
    const long v = sysconf(name);
    if (v > 0) return static_cast<uint64_t>(v);
  }
  return uint64_t{64} << 20;  // unknown: assume a large server LLC
}

}  // namespace

uint64_t read_sum(const std::byte* data, size_t bytes, kernels::cpu::isa path) {
  using kernels::cpu::isa;
  if (path == isa::best) path = kernels::cpu::active_isa();
  if (!kernels::cpu::isa_supported(path)) throw std::invalid_argument("read_sum: this CPU cannot run the requested ISA path");
  switch (path) {
    case isa::avx512:
      return detail::read_sum_avx512(data, bytes);
    case isa::avx2:
      return detail::read_sum_avx2(data, bytes);
    default:
      return detail::read_sum_scalar(data, bytes);
  }
}

uint64_t default_read_buffer_bytes() {
  uint64_t b = std::clamp(4 * last_level_cache_bytes(), uint64_t{256} << 20, uint64_t{4} << 30);
  if (const uint64_t usable = memory::usable_memory_bytes(memory::read_memory_limits()); usable > 0) b = std::min(b, usable / 4);
  return std::max(k_huge_page, b / k_huge_page * k_huge_page);
}

struct read_ceiling_probe::impl {
  kernels::cpu::thread_pool& pool;
  uint64_t bytes;
  // Huge pages: streaming through 4 KiB pages would add TLB misses that a true ceiling (and
  // the packed weights decode streams, which live in the same kind of buffer) does not pay.
  memory::huge_buffer buf;
  kernels::cpu::isa path = kernels::cpu::active_isa();
  // One atomic add per chunk per pass (negligible next to megabytes of reads); the total is
  // kept so the reads have a use.
  std::atomic<uint64_t> total{0};

  impl(kernels::cpu::thread_pool& p, uint64_t b) : pool(p), bytes(b), buf(b) {}

  int64_t lines() const { return static_cast<int64_t>(bytes / 64); }  // work is split in 64-byte lines
  void pass() {
    std::byte* base = buf.data();
    pool.parallel_for(lines(), 1, [&](int64_t b, int64_t e) {
      total.fetch_add(read_sum(base + b * 64, static_cast<size_t>(e - b) * 64, path), std::memory_order_relaxed);
    });
  }
};

read_ceiling_probe::read_ceiling_probe(kernels::cpu::thread_pool& pool, uint64_t buffer_bytes)
    : impl_(std::make_unique<impl>(pool, std::max<uint64_t>(64 << 10, buffer_bytes / 64 * 64))) {
  std::byte* base = impl_->buf.data();
  // Filled by the threads that will read it (first touch places pages near them), with a
  // non-zero pattern so no page can be the shared zero page.
  pool.parallel_for(impl_->lines(), 1, [&](int64_t b, int64_t e) {
    for (int64_t l = b; l < e; ++l) std::memset(base + l * 64, static_cast<int>(l & 0x7f) | 1, 64);
  });
  impl_->pass();  // untimed: faults in the huge pages, wakes the workers
}

read_ceiling_probe::~read_ceiling_probe() {
  // An opaque use of the sums: the compiler cannot drop the reads.
  const uint64_t sink = impl_->total.load();
  asm volatile("" : : "r"(sink) : "memory");
}

uint64_t read_ceiling_probe::bytes() const { return impl_->bytes; }

double read_ceiling_probe::measure() {
  const auto t0 = std::chrono::steady_clock::now();
  impl_->pass();
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return static_cast<double>(impl_->bytes) / s / 1e9;
}

read_ceiling_result measure_read_ceiling(kernels::cpu::thread_pool& pool, uint64_t buffer_bytes, int reps) {
  if (reps < 1) throw std::invalid_argument("measure_read_ceiling: reps must be at least 1");
  read_ceiling_probe probe(pool, buffer_bytes);
  read_ceiling_result r;
  r.buffer_bytes = probe.bytes();
  for (int i = 0; i < reps; ++i) r.gb_s.push_back(probe.measure());
  r.gb_s_summary = summarize(r.gb_s);
  return r;
}

}  // namespace tandem::bench
