#include "memory/memory_limits.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace tandem::memory {
namespace {

uint64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

// Whole contents of a small (pseudo-)file, or nullopt when it cannot be read.
std::optional<std::string> read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::optional<uint64_t> parse_u64(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end == s.data()) return std::nullopt;
  return v;
}

// The number after "key" at the start of a line of a "key value" file (meminfo, memory.stat).
std::optional<uint64_t> line_value(std::string_view text, std::string_view key) {
  for (size_t at = 0; at < text.size();) {
    const size_t eol = std::min(text.find('\n', at), text.size());
    const auto line = text.substr(at, eol - at);
    if (line.substr(0, key.size()) == key) return parse_u64(line.substr(key.size()));
    at = eol + 1;
  }
  return std::nullopt;
}

// One cgroup hierarchy's memory files: v2 (unified) or v1 (the memory controller's own).
struct cgroup_files {
  bool v2;
  const char* root;           // mount point
  const char* limit;          // limit file; v2 writes "max" for none, v1 a huge number
  const char* usage;          // usage, page cache included
  const char* inactive_file;  // memory.stat key of the inactive page cache (hierarchical)
};
constexpr cgroup_files k_cgroup_v2{true, "/sys/fs/cgroup", "memory.max", "memory.current", "inactive_file "};
constexpr cgroup_files k_cgroup_v1{false, "/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file "};

// The process's path in a hierarchy from /proc/self/cgroup ("0::/a/b" for v2,
// "4:memory:/a/b" for v1), relative; empty when absent or the root.
std::filesystem::path cgroup_path(std::string_view self, bool v2) {
  for (size_t at = 0; at < self.size();) {
    const size_t eol = std::min(self.find('\n', at), self.size());
    const auto line = self.substr(at, eol - at);
    at = eol + 1;
    const size_t c1 = line.find(':'), c2 = c1 == std::string_view::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string_view::npos) continue;
    const auto controllers = line.substr(c1 + 1, c2 - c1 - 1);  // comma-separated; empty for v2
    bool match = v2 && line.substr(0, c1) == "0" && controllers.empty();
    for (size_t c = 0; !v2 && !match && c <= controllers.size();) {
      const size_t comma = std::min(controllers.find(',', c), controllers.size());
      match = controllers.substr(c, comma - c) == "memory";
      c = comma + 1;
    }
    if (match) return std::filesystem::path(std::string(line.substr(c2 + 1))).lexically_normal().relative_path();
  }
  return {};
}

// The least free memory over the process's cgroup and its ancestors (a child's limit does not
// lift a parent's). Free = limit - (usage - inactive_file): the working set as container
// runtimes count it, since inactive page cache is reclaimed before anything is killed.
std::optional<uint64_t> cgroup_free_bytes(std::string_view self, const cgroup_files& files) {
  namespace fs = std::filesystem;
  const fs::path root = files.root;
  const auto rel = cgroup_path(self, files.v2);
  fs::path dir = rel.empty() ? root : root / rel;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) dir = root;  // a cgroup namespace can hide the path
  std::optional<uint64_t> best;
  for (;; dir = dir.parent_path()) {
    if (const auto limit = parse_cgroup_memory_max(read_text(dir / files.limit).value_or(""))) {
      const uint64_t usage = parse_u64(read_text(dir / files.usage).value_or("")).value_or(0);
      const uint64_t inactive = line_value(read_text(dir / "memory.stat").value_or(""), files.inactive_file).value_or(0);
      const uint64_t working = usage - std::min(usage, inactive);
      const uint64_t free = *limit > working ? *limit - working : 0;
      best = best ? std::min(*best, free) : free;
    }
    if (dir.string().size() <= root.string().size()) break;  // root done (or a path that escaped it)
  }
  return best;
}

std::optional<uint64_t> cgroup_free_bytes() {
  const auto self = read_text("/proc/self/cgroup");
  if (!self) return std::nullopt;
  std::optional<uint64_t> best;
  for (const auto* files : {&k_cgroup_v2, &k_cgroup_v1})
    if (const auto v = cgroup_free_bytes(*self, *files)) best = best ? std::min(*best, *v) : *v;
  return best;
}

// RLIMIT_AS counts address space, not memory: what is left is the limit minus what the
// process has mapped already (first field of /proc/self/statm, in pages).
std::optional<uint64_t> address_space_free_bytes() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return std::nullopt;
  const auto limit = static_cast<uint64_t>(rl.rlim_cur);
  const long page = ::sysconf(_SC_PAGE_SIZE);
  const auto pages = parse_u64(read_text("/proc/self/statm").value_or(""));
  if (!pages || page <= 0) return limit;
  const uint64_t used = *pages * static_cast<uint64_t>(page);
  return limit > used ? limit - used : 0;
}

}  // namespace

std::optional<uint64_t> parse_meminfo_available(std::string_view meminfo) {
  const auto kib = line_value(meminfo, "MemAvailable:");
  if (!kib || *kib > UINT64_MAX / 1024) return std::nullopt;
  return *kib * 1024;
}

std::optional<uint64_t> parse_cgroup_memory_max(std::string_view memory_max) {
  // "max" (no limit) and anything malformed both mean "no number to go by".
  return parse_u64(memory_max);
}

memory_limits read_memory_limits() {
  memory_limits l;
  if (const auto text = read_text("/proc/meminfo")) l.mem_available = parse_meminfo_available(*text);
  l.cgroup_free = cgroup_free_bytes();
  l.address_space_free = address_space_free_bytes();
  l.physical = physical_memory_bytes();
  return l;
}

uint64_t usable_memory_bytes(const memory_limits& l) {
  std::optional<uint64_t> least;
  for (const auto& v : {l.mem_available, l.cgroup_free, l.address_space_free})
    if (v) least = least ? std::min(*least, *v) : *v;
  return least.value_or(l.physical);
}

}  // namespace tandem::memory
