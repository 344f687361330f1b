// bench/dot_ceiling: the dot chain really does its multiply-adds on every ISA path; the
// ceiling measurement reports one positive figure per repetition.
#include "bench/dot_ceiling.h"

#include <doctest/doctest.h>

#include <stdexcept>

#include "tests/test_support.h"

using namespace tandem;
using kernels::cpu::isa;

TEST_SUITE("bench_dot_ceiling") {
  TEST_CASE("dot_chain sums -2 per group of four products on every supported path") {
    for (isa path : {isa::scalar, isa::avx2, isa::avx512, isa::best}) {
      if (!kernels::cpu::isa_supported(path)) continue;
      CAPTURE(kernels::cpu::isa_name(path));
      const int64_t per = bench::dot_chain_macs_per_iteration(path);
      CHECK(per > 0);
      CHECK(per % 4 == 0);
      for (int64_t it : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{1000}}) {
        CAPTURE(it);
        CHECK(bench::dot_chain(it, path) == -(it * per) / 2);
      }
    }
  }

  TEST_CASE("dot_chain on the avx2 path with and without AVX-VNNI") {
    if (!kernels::cpu::cpu_has_avx_vnni()) return;
    const bool before = kernels::cpu::avx_vnni_allowed();
    for (const bool vnni : {false, true}) {
      CAPTURE(vnni);
      kernels::cpu::set_avx_vnni(vnni);
      const int64_t per = bench::dot_chain_macs_per_iteration(isa::avx2);
      CHECK(per == (vnni ? 12 * 32 : 6 * 32));
      CHECK(bench::dot_chain(1000, isa::avx2) == -(1000 * per) / 2);
    }
    kernels::cpu::set_avx_vnni(before);
  }

  TEST_CASE("the wider paths do more multiply-adds per iteration") {
    if (kernels::cpu::isa_supported(isa::avx2))
      CHECK(bench::dot_chain_macs_per_iteration(isa::avx2) > bench::dot_chain_macs_per_iteration(isa::scalar));
    if (kernels::cpu::isa_supported(isa::avx512))
      CHECK(bench::dot_chain_macs_per_iteration(isa::avx512) > bench::dot_chain_macs_per_iteration(isa::avx2));
  }

  TEST_CASE("dot_chain refuses counts that could overflow its int32 lanes") {
    CHECK_THROWS_AS(bench::dot_chain(-1), std::invalid_argument);
    CHECK_THROWS_AS(bench::dot_chain((int64_t{1} << 28) + 1), std::invalid_argument);
  }

  TEST_CASE("measure_dot_ceiling: one positive figure per repetition, summarised") {
    kernels::cpu::thread_pool pool(2);
    const auto r = bench::measure_dot_ceiling(pool, 3, 5);
    REQUIRE(r.gmac_s.size() == 3);
    for (double g : r.gmac_s) CHECK(g > 0);
    CHECK(r.gmac_s_summary.count == 3);
    CHECK(r.gmac_s_summary.min <= r.gmac_s_summary.median);
    CHECK(r.gmac_s_summary.median <= r.gmac_s_summary.max);
    CHECK_THROWS_AS(bench::measure_dot_ceiling(pool, 0), std::invalid_argument);
    CHECK_THROWS_AS(bench::measure_dot_ceiling(pool, 1, 0), std::invalid_argument);
  }
}
