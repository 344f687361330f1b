// The HTTP load test's counting, on a short run against the real server: clients that hang up
// are counted apart from failures, and the server ends with no KV held.
#include "bench/http_load.h"

#include <doctest/doctest.h>

#include "tests/api/served_fixture.h"

using namespace std::chrono_literals;

TEST_SUITE("http_load") {
  TEST_CASE("a short load with hang-ups: every request completes or is dropped on purpose, and the engine ends clean") {
    tandem::test::served_fixture f;
    tandem::bench::http_load_options o;
    o.clients = 6;
    o.duration = 1500ms;
    o.baseline = 300ms;
    o.disconnect_fraction = 0.34;  // two of six
    o.models = {"stories", "stories-q8"};
    o.max_tokens = 24;
    const auto r = tandem::bench::run_http_load(f.port, o);
    CAPTURE(tandem::bench::format_table(r));
    CHECK(r.failed == 0);
    CHECK(r.completed > 0);
    CHECK(r.disconnected > 0);
    CHECK(r.chunks > 0);
    CHECK(r.baseline_chunks_per_s > 0);
    const auto j = tandem::bench::to_json(r);
    for (const char* key : {"clients", "requests_completed", "requests_disconnected", "requests_failed", "chunks_per_s", "vs_single_client",
                            "ttft_p50_ms", "ttft_p99_ms"})
      CHECK(j.contains(key));
    f.served->executor().drain();
    for (const auto& m : f.served->models()) CHECK(f.served->executor().kv_blocks_in_use(m->name()) == 0);
    f.served->arbiter().check_integrity();
  }
}
