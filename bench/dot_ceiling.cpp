#include "bench/dot_ceiling.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string>

#include "bench/dot_kernels.h"

namespace tandem::bench {
namespace detail {

int64_t dot_chain_scalar(int64_t iterations, uint32_t a, uint32_t b) {
  constexpr int C = k_dot_chains_scalar;
  int32_t acc[C] = {};
  uint32_t ac[C];
  for (uint32_t& x : ac) x = a;
  for (int64_t i = 0; i < iterations; ++i)
    for (int c = 0; c < C; ++c) {
      // Each chain's pattern looks changed every time: no product is hoisted or shared.
      asm("" : "+r"(ac[c]));
      for (int k = 0; k < 4; ++k) acc[c] += static_cast<int32_t>((ac[c] >> (8 * k)) & 0xFF) * static_cast<int8_t>(static_cast<uint8_t>(b >> (8 * k)));
    }
  int64_t sum = 0;
  for (int32_t x : acc) sum += x;
  return sum;
}

}  // namespace detail

namespace {

using kernels::cpu::isa;

// u8 1, 2, 3, 4 and s8 1, -1, 1, -1, little-endian: 1 - 2 + 3 - 4 = -2 per group.
constexpr uint32_t k_pattern_a = 0x04030201u;
constexpr uint32_t k_pattern_b = 0xFF01FF01u;

isa resolve(isa path) {
  if (path == isa::best) path = kernels::cpu::active_isa();
  if (!kernels::cpu::isa_supported(path)) throw std::invalid_argument("dot_chain: this CPU cannot run the requested ISA path");
  return path;
}

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

}  // namespace

int64_t dot_chain_macs_per_iteration(isa path) {
  switch (resolve(path)) {
    case isa::avx512:
      return detail::k_dot_macs_avx512;
    case isa::avx2:
      return kernels::cpu::avx_vnni_active() ? detail::k_dot_macs_avxvnni : detail::k_dot_macs_avx2;
    default:
      return detail::k_dot_macs_scalar;
  }
}

int64_t dot_chain(int64_t iterations, isa path) {
  path = resolve(path);
  if (iterations < 0 || iterations > (int64_t{1} << 28))
    throw std::invalid_argument("dot_chain: iterations must be in [0, 2^28], got " + std::to_string(iterations));
  switch (path) {
    case isa::avx512:
      return detail::dot_chain_avx512(iterations, k_pattern_a, k_pattern_b);
    case isa::avx2:
      if (kernels::cpu::avx_vnni_active()) return detail::dot_chain_avxvnni(iterations, k_pattern_a, k_pattern_b);
      return detail::dot_chain_avx2(iterations, k_pattern_a, k_pattern_b);
    default:
      return detail::dot_chain_scalar(iterations, k_pattern_a, k_pattern_b);
  }
}

dot_ceiling_result measure_dot_ceiling(kernels::cpu::thread_pool& pool, int reps, double pass_ms) {
  if (reps < 1) throw std::invalid_argument("measure_dot_ceiling: reps must be at least 1");
  if (!(pass_ms > 0)) throw std::invalid_argument("measure_dot_ceiling: pass_ms must be positive");
  const isa path = kernels::cpu::active_isa();
  const int64_t macs = dot_chain_macs_per_iteration(path);
  // Calibration on this thread: grow a run until it takes a few milliseconds.
  int64_t probe = 1 << 12;
  double probe_s = 0;
  for (;;) {
    const auto t0 = clock_type::now();
    const int64_t sink = dot_chain(probe, path);
    asm volatile("" : : "r"(sink));
    probe_s = seconds_since(t0);
    if (probe_s > 2e-3 || probe >= (int64_t{1} << 24)) break;
    probe *= 4;
  }
  const double per_s = static_cast<double>(probe) / std::max(probe_s, 1e-9);
  // Many small chunks, which the pool hands out in pieces as threads come free: a thread that
  // wakes late leaves its share to the others.
  const int64_t chunks = int64_t{16} * pool.size();
  const int64_t per_chunk =
      std::clamp<int64_t>(static_cast<int64_t>(per_s * pass_ms / 1e3 * pool.size() / static_cast<double>(chunks)), 1, int64_t{1} << 28);
  std::atomic<int64_t> total{0};
  auto pass = [&] {
    pool.parallel_for(chunks, 1, [&](int64_t b, int64_t e) {
      int64_t s = 0;
      for (int64_t c = b; c < e; ++c) s += dot_chain(per_chunk, path);
      total.fetch_add(s, std::memory_order_relaxed);
    });
  };
  pass();  // untimed: wakes the workers and lets the clock settle under vector load
  dot_ceiling_result r;
  for (int i = 0; i < reps; ++i) {
    const auto t0 = clock_type::now();
    pass();
    r.gmac_s.push_back(static_cast<double>(chunks * per_chunk * macs) / seconds_since(t0) / 1e9);
  }
  // Every pass (the untimed one too) must have made every product.
  const int64_t want = -(reps + 1) * chunks * (per_chunk * macs / 2);
  if (total.load() != want)
    throw std::runtime_error("measure_dot_ceiling: checksum " + std::to_string(total.load()) + ", expected " + std::to_string(want));
  r.gmac_s_summary = summarize(r.gmac_s);
  return r;
}

}  // namespace tandem::bench
