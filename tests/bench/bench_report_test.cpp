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
    const bool vnni_before = kernels::cpu::avx_vnni_allowed();
    struct path_case {
      isa path;
      bool avx_vnni;
      const char* name;
    };
    for (const auto& c : {path_case{isa::scalar, true, "scalar"}, path_case{isa::avx2, false, "avx2"}, path_case{isa::avx2, true, "avxvnni"}}) {
      if (!kernels::cpu::isa_supported(c.path) || (c.path == isa::avx2 && c.avx_vnni && !kernels::cpu::cpu_has_avx_vnni())) continue;
      CAPTURE(c.name);
      auto o = tiny(c.path);
      o.avx_vnni = c.avx_vnni;
      const auto r = bench::run_bench(o);
      CHECK(r.isa == c.name);
      CHECK(r.result.decode.median > 0);
      CHECK(kernels::cpu::requested_isa() == before);
      CHECK(kernels::cpu::avx_vnni_allowed() == vnni_before);
    }
    const auto r = bench::run_bench(tiny(isa::best));
    CHECK(r.isa == kernels::cpu::active_path_name());
    CHECK(kernels::cpu::requested_isa() == before);
  }

  TEST_CASE("run_bench puts the path back when it fails") {
    if (!kernels::cpu::isa_supported(isa::avx2)) return;
    const isa before = kernels::cpu::requested_isa();
    auto o = tiny(isa::avx2);
    o.avx_vnni = !kernels::cpu::avx_vnni_allowed();
    o.model_path = "/nonexistent.gguf";
    const bool vnni_before = kernels::cpu::avx_vnni_allowed();
    CHECK_THROWS(bench::run_bench(o));
    CHECK(kernels::cpu::requested_isa() == before);
    CHECK(kernels::cpu::avx_vnni_allowed() == vnni_before);
  }
}
