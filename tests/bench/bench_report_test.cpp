// bench/bench_report: run_bench on the committed tiny model, the kernel path it is asked for.
#include "bench/bench_report.h"

#include <doctest/doctest.h>

#include "kernels/cpu/isa.h"
#include "tests/test_support.h"

using namespace tandem;
using kernels::cpu::isa;

namespace {
bench::bench_options tiny(isa path) {
  bench::bench_options o;
  o.model_path = test::data_path("stories260K-q8_0.gguf").string();
  o.threads = 2;
  o.read_buffer_bytes = 4 << 20;
  o.params.prompt = 4;
  o.params.gen = 2;
  o.params.batch = 2;
  o.params.reps = 1;
  o.isa = path;
  return o;
}
}  // namespace

TEST_SUITE("bench") {
  TEST_CASE("run_bench takes the kernel path it is given, then puts the process's back") {
    const isa before = kernels::cpu::requested_isa();
    for (const isa path : {isa::scalar, isa::avx2}) {
      if (!kernels::cpu::isa_supported(path)) continue;
      CAPTURE(kernels::cpu::isa_name(path));
      const auto r = bench::run_bench(tiny(path));
      CHECK(r.isa == kernels::cpu::isa_name(path));
      CHECK(r.result.decode.median > 0);
      CHECK(kernels::cpu::requested_isa() == before);
    }
    const auto r = bench::run_bench(tiny(isa::best));
    CHECK(r.isa == kernels::cpu::isa_name(kernels::cpu::active_isa()));
    CHECK(kernels::cpu::requested_isa() == before);
  }

  TEST_CASE("run_bench puts the path back when it fails") {
    if (!kernels::cpu::isa_supported(isa::avx2)) return;
    const isa before = kernels::cpu::requested_isa();
    auto o = tiny(isa::avx2);
    o.model_path = "/nonexistent.gguf";
    CHECK_THROWS(bench::run_bench(o));
    CHECK(kernels::cpu::requested_isa() == before);
  }
}
