// The integer dot-product ceiling: how many int8 multiply-adds per second this process's
// threads can issue with the instruction the quantized kernels are built on (AVX-512 VNNI
// vpdpbusd; AVX2 vpmaddubsw + vpmaddwd + vpaddd; plain C++ on the scalar path), with no loads,
// no unpacking and no float work. Batched decode and prefill of a quantized model multiply
// every weight once per row, so weight elements per token over this figure is the fastest a
// row can be, however good the kernels: the compute-side twin of the memory-read ceiling.
#pragma once

#include <cstdint>
#include <vector>

#include "bench/stats.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/thread_pool.h"

namespace tandem::bench {

// Multiply-adds one iteration of dot_chain does on `path` (scalar, avx2 or avx512; best means
// kernels::cpu::active_isa()).
int64_t dot_chain_macs_per_iteration(kernels::cpu::isa path = kernels::cpu::isa::best);

// Runs `iterations` iterations of independent multiply-add chains of the u8 bytes 1, 2, 3, 4
// against the s8 bytes 1, -1, 1, -1 (each group of four adds -2 to its int32 lane) and returns
// the sum of every lane: -(iterations * dot_chain_macs_per_iteration(path)) / 2, which proves
// the work was done. Throws std::invalid_argument when the CPU cannot run `path`
// (kernels::cpu::isa_supported) or iterations is outside [0, 2^28] (the lanes are int32).
int64_t dot_chain(int64_t iterations, kernels::cpu::isa path = kernels::cpu::isa::best);

// Rows per second `gmac_s` (1e9 multiply-adds per second) allows at `macs_per_row`
// multiply-adds a row; 0 when macs_per_row is 0 (no quantized matrices).
inline double rows_per_second(double gmac_s, uint64_t macs_per_row) {
  return macs_per_row > 0 ? gmac_s * 1e9 / static_cast<double>(macs_per_row) : 0.0;
}

struct dot_ceiling_result {
  std::vector<double> gmac_s;  // one per repetition, in measurement order (1 GMAC = 1e9)
  summary gmac_s_summary;
};

// Calibrates a pass of about `pass_ms` milliseconds on the pool's threads, runs it once
// untimed, then `reps` times timed, each pass split into many equal chunks that the threads
// take as they go (so a late-waking worker cannot stretch it), on the active ISA path, and
// checks the sum of every chunk's checksum. Throws std::invalid_argument for reps < 1 or
// pass_ms <= 0, std::runtime_error if the checksum is wrong.
dot_ceiling_result measure_dot_ceiling(kernels::cpu::thread_pool& pool, int reps, double pass_ms = 50);

}  // namespace tandem::bench
