#include "kernels/device_probe.h"

#include <doctest/doctest.h>

using namespace tandem;

TEST_SUITE("device_probe") {
  TEST_CASE("probing CUDA never fails, and explains an absent device") {
    const auto r = kernels::probe_cuda();
#if defined(TANDEM_HAVE_CUDA)
    CHECK(r.built);
#else
    CHECK_FALSE(r.built);
#endif
    if (r.devices.empty()) {
      CHECK_FALSE(r.reason.empty());
    } else {
      for (const auto& d : r.devices) {
        CHECK_FALSE(d.name.empty());
        CHECK(d.total_bytes > 0);
        CHECK(d.compute_major >= 5);
      }
    }
  }
}
