// bench/read_ceiling: the read kernel really reads every byte on every ISA path; the
// ceiling measurement reports one figure per repetition.
#include "bench/read_ceiling.h"

#include <doctest/doctest.h>

#include <cstring>
#include <vector>

using namespace tandem;
using kernels::cpu::isa;

namespace {
// Words 1, 2, 3, ... so the sum depends on every word and the reference is a formula.
std::vector<std::byte> counting_words(size_t words) {
  std::vector<std::byte> buf(words * 8);
  for (size_t i = 0; i < words; ++i) {
    const uint64_t w = i + 1;
    std::memcpy(buf.data() + i * 8, &w, 8);
  }
  return buf;
}
}  // namespace

TEST_SUITE("bench_read_ceiling") {
  TEST_CASE("read_sum adds every 64-bit word on every supported path, tails included") {
    for (isa path : {isa::scalar, isa::avx2, isa::avx512, isa::best}) {
      if (!kernels::cpu::isa_supported(path)) continue;
      CAPTURE(kernels::cpu::isa_name(path));
      // Lengths around the 128- and 256-byte unrolled steps, and an empty buffer.
      for (size_t words : {size_t{0}, size_t{1}, size_t{15}, size_t{16}, size_t{31}, size_t{32}, size_t{33}, size_t{1000}, size_t{4099}}) {
        CAPTURE(words);
        const auto buf = counting_words(words);
        CHECK(bench::read_sum(buf.data(), buf.size(), path) == words * (words + 1) / 2);
      }
    }
  }

  TEST_CASE("read_sum wraps modulo 2^64 like unsigned addition") {
    std::vector<std::byte> buf(64 * 8);
    const uint64_t big = ~uint64_t{0};  // -1: 64 of them sum to -64
    for (size_t i = 0; i < 64; ++i) std::memcpy(buf.data() + i * 8, &big, 8);
    for (isa path : {isa::scalar, isa::avx2, isa::avx512}) {
      if (!kernels::cpu::isa_supported(path)) continue;
      CHECK(bench::read_sum(buf.data(), buf.size(), path) == uint64_t{0} - 64);
    }
  }

  TEST_CASE("the default buffer is a whole number of 2 MiB pages of at least 2 MiB and at most 4 GiB") {
    const uint64_t b = bench::default_read_buffer_bytes();
    CHECK(b % (uint64_t{2} << 20) == 0);
    CHECK(b >= (uint64_t{2} << 20));
    CHECK(b <= (uint64_t{4} << 30));
  }

  TEST_CASE("measure_read_ceiling: one positive figure per repetition, summarised") {
    kernels::cpu::thread_pool pool(2);
    const auto r = bench::measure_read_ceiling(pool, uint64_t{4} << 20, 3);
    CHECK(r.buffer_bytes == (uint64_t{4} << 20));
    REQUIRE(r.gb_s.size() == 3);
    for (double g : r.gb_s) CHECK(g > 0);
    CHECK(r.gb_s_summary.count == 3);
    CHECK(r.gb_s_summary.min <= r.gb_s_summary.median);
    CHECK(r.gb_s_summary.median <= r.gb_s_summary.max);
    CHECK_THROWS_AS(bench::measure_read_ceiling(pool, uint64_t{4} << 20, 0), std::invalid_argument);
  }

  TEST_CASE("read_ceiling_probe: a kept buffer, each pass timed when asked") {
    kernels::cpu::thread_pool pool(2);
    bench::read_ceiling_probe probe(pool, (uint64_t{1} << 20) + 100);  // rounded down to whole lines
    CHECK(probe.bytes() == (uint64_t{1} << 20) + 64);
    for (int i = 0; i < 3; ++i) CHECK(probe.measure() > 0);
    bench::read_ceiling_probe tiny(pool, 1000);  // at least 64 KiB
    CHECK(tiny.bytes() == (uint64_t{64} << 10));
    CHECK(tiny.measure() > 0);
  }
}
