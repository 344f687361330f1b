// The ISA-specific bodies of read_sum (bench/read_ceiling.h), each compiled in its own file
// with that ISA's flags and reached only after the CPU was checked to support it. Same
// contract as read_sum: bytes is a multiple of 8.
#pragma once

#include <cstddef>
#include <cstdint>

namespace tandem::bench::detail {

uint64_t read_sum_scalar(const std::byte* data, size_t bytes);
uint64_t read_sum_avx2(const std::byte* data, size_t bytes);
uint64_t read_sum_avx512(const std::byte* data, size_t bytes);

}  // namespace tandem::bench::detail
