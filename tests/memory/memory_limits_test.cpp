#include "memory/memory_limits.h"

#include <doctest/doctest.h>

#include <string>

namespace tandem {

TEST_SUITE("memory_limits") {
  TEST_CASE("usable memory is the least of the limits that are set, else physical RAM") {
    memory::memory_limits l;
    l.physical = 100;
    CHECK(memory::usable_memory_bytes(l) == 100);
    l.mem_available = 80;
    CHECK(memory::usable_memory_bytes(l) == 80);
    l.cgroup_free = 90;
    CHECK(memory::usable_memory_bytes(l) == 80);
    l.address_space_free = 30;
    CHECK(memory::usable_memory_bytes(l) == 30);
    l.cgroup_free = 0;  // a cgroup at its limit
    CHECK(memory::usable_memory_bytes(l) == 0);
    CHECK(memory::usable_memory_bytes(memory::memory_limits{}) == 0);  // nothing known

    const auto live = memory::read_memory_limits();
    CHECK(live.physical > 0);
    if (live.mem_available) CHECK(*live.mem_available > 0);
    CHECK(memory::usable_memory_bytes(live) > 0);
  }

  TEST_CASE("parsing /proc/meminfo and cgroup limits") {
    const std::string meminfo = "MemTotal:       24000000 kB\nMemFree:         2000000 kB\nMemAvailable:   21000000 kB\nBuffers: 1 kB\n";
    CHECK(memory::parse_meminfo_available(meminfo) == uint64_t{21000000} * 1024);
    CHECK_FALSE(memory::parse_meminfo_available("MemTotal: 5 kB\n").has_value());
    CHECK_FALSE(memory::parse_meminfo_available("MemAvailable: lots\n").has_value());
    CHECK_FALSE(memory::parse_meminfo_available("").has_value());
    CHECK(memory::parse_cgroup_memory_max("1073741824\n") == uint64_t{1} << 30);
    CHECK_FALSE(memory::parse_cgroup_memory_max("max\n").has_value());
    CHECK_FALSE(memory::parse_cgroup_memory_max("").has_value());
  }
}

}  // namespace tandem
