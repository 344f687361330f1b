// What bounds this process's memory right now (Linux /proc/meminfo, cgroups v1 and v2,
// RLIMIT_AS), so a request that follows file metadata can be refused with a message instead
// of bad_alloc or the OOM killer.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace tandem::memory {

// Each bound in bytes; nullopt where that bound is absent or could not be read.
struct memory_limits {
  std::optional<uint64_t> mem_available;       // MemAvailable in /proc/meminfo
  std::optional<uint64_t> cgroup_free;         // least over the process's cgroups (v2, and v1's memory
                                               // controller) and their ancestors of the limit minus
                                               // the working set (usage - inactive page cache)
  std::optional<uint64_t> address_space_free;  // RLIMIT_AS minus the address space in use
  uint64_t physical = 0;                       // installed RAM; 0 when unknown
};
// Reads the limits of the running process (Linux /proc and /sys/fs/cgroup, getrlimit).
memory_limits read_memory_limits();
// The least of the bounds that are set; physical when none is; 0 when nothing is known.
uint64_t usable_memory_bytes(const memory_limits& l);
// Parsers of the files read_memory_limits reads, exposed for tests. "MemAvailable:  N kB" ->
// N * 1024; a cgroup limit "N" -> N, "max" (v2: no limit) -> nullopt; nullopt for malformed text.
std::optional<uint64_t> parse_meminfo_available(std::string_view meminfo);
std::optional<uint64_t> parse_cgroup_memory_max(std::string_view memory_max);

}  // namespace tandem::memory
