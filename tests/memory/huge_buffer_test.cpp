#include "memory/huge_buffer.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <cstring>
#include <utility>

using namespace tandem;

TEST_SUITE("huge_buffer") {
  TEST_CASE("2 MiB aligned, the requested size, writable end to end") {
    for (const size_t n : {size_t{1}, size_t{4096}, memory::k_huge_page, memory::k_huge_page + 1, 3 * memory::k_huge_page - 7}) {
      CAPTURE(n);
      memory::huge_buffer b(n);
      REQUIRE(b.data() != nullptr);
      CHECK(reinterpret_cast<uintptr_t>(b.data()) % memory::k_huge_page == 0);
      CHECK(b.size() == n);
      std::memset(b.data(), 0x5A, n);
      CHECK(static_cast<unsigned char>(b.data()[n - 1]) == 0x5A);
    }
  }

  TEST_CASE("empty and moved-from buffers own nothing") {
    memory::huge_buffer e;
    CHECK(e.data() == nullptr);
    CHECK(e.size() == 0);
    memory::huge_buffer z(0);
    CHECK(z.data() == nullptr);
    memory::huge_buffer a(100);
    std::byte* p = a.data();
    memory::huge_buffer b = std::move(a);
    CHECK(b.data() == p);
    CHECK(a.data() == nullptr);  // NOLINT(bugprone-use-after-move): checking the moved-from state
    CHECK(a.size() == 0);
  }
}
