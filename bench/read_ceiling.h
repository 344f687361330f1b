// The memory-read ceiling: how fast this process can stream bytes from RAM with a given
// thread pool. Decode of a model whose weights do not fit in cache reads every weight once per
// token, so bytes-per-token × tok/s against this figure says how close decode is to the
// hardware limit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "bench/stats.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/thread_pool.h"

namespace tandem::bench {

// Wrapping sum of the 64-bit little-endian words of [data, data + bytes); bytes must be a
// multiple of 8. Every byte is loaded (with the widest loads of `path`, several independent
// accumulators so loads, not adds, bound the loop), so the result proves the whole buffer
// was read. `path` must be supported by the CPU (kernels::cpu::isa_supported); best means
// kernels::cpu::active_isa().
uint64_t read_sum(const std::byte* data, size_t bytes, kernels::cpu::isa path = kernels::cpu::isa::best);

// Size of the buffer the ceiling is measured on: four times the last-level cache (so
// neither it nor a victim cache can hold a useful part of it), at least 256 MiB, at most
// 4 GiB and at most a quarter of the memory this process can get. Rounded to 2 MiB.
uint64_t default_read_buffer_bytes();

struct read_ceiling_result {
  uint64_t buffer_bytes = 0;
  std::vector<double> gb_s;  // one per repetition, in measurement order (1 GB = 1e9 bytes)
  summary gb_s_summary;
};

// The buffer of the ceiling, kept so that single passes can be timed between other
// measurements (decode repetitions, say: on a shared machine the bandwidth available moves
// within seconds, so a ratio is only meaningful between figures taken side by side).
class read_ceiling_probe {
 public:
  // Allocates buffer_bytes (rounded down to a multiple of 64, at least 64 KiB) in huge pages,
  // filled by the pool's threads and read once untimed. Throws std::bad_alloc when the buffer
  // cannot be had.
  read_ceiling_probe(kernels::cpu::thread_pool& pool, uint64_t buffer_bytes);
  ~read_ceiling_probe();
  read_ceiling_probe(const read_ceiling_probe&) = delete;
  read_ceiling_probe& operator=(const read_ceiling_probe&) = delete;

  uint64_t bytes() const;
  // One timed pass over the whole buffer, split across the pool in contiguous chunks (one per
  // thread) with read_sum on the active ISA path: GB/s (1 GB = 1e9 bytes).
  double measure();

 private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

// A probe of buffer_bytes timed `reps` times, then freed. Throws std::invalid_argument for
// reps < 1, std::bad_alloc when the buffer cannot be had.
read_ceiling_result measure_read_ceiling(kernels::cpu::thread_pool& pool, uint64_t buffer_bytes, int reps);

}  // namespace tandem::bench
