// The ISA-specific bodies of dot_chain (bench/dot_ceiling.h), each compiled in its own file
// with that ISA's flags and reached only after the CPU was checked to support it.
#pragma once

#include <cstdint>

namespace tandem::bench::detail {

// Independent chains per path: enough to cover the instructions' latency within the
// registers there are (AVX2 keeps a weight register per chain, as its kernels do).
inline constexpr int k_dot_chains_scalar = 4;
inline constexpr int k_dot_chains_avx2 = 6;
inline constexpr int k_dot_chains_avx512 = 12;
inline constexpr int k_dot_chains_avxvnni = 12;  // the avx2 path with AVX-VNNI: vpdpbusd on ymm
inline constexpr int64_t k_dot_macs_scalar = k_dot_chains_scalar * 4;
inline constexpr int64_t k_dot_macs_avx2 = k_dot_chains_avx2 * 32;
inline constexpr int64_t k_dot_macs_avx512 = k_dot_chains_avx512 * 64;
inline constexpr int64_t k_dot_macs_avxvnni = k_dot_chains_avxvnni * 32;

// a: the u8 pattern, b: the s8 pattern, each as one little-endian 32-bit group of four bytes.
int64_t dot_chain_scalar(int64_t iterations, uint32_t a, uint32_t b);
int64_t dot_chain_avx2(int64_t iterations, uint32_t a, uint32_t b);
int64_t dot_chain_avx512(int64_t iterations, uint32_t a, uint32_t b);
int64_t dot_chain_avxvnni(int64_t iterations, uint32_t a, uint32_t b);

}  // namespace tandem::bench::detail
