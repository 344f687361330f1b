#include "memory/cpu_backend.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "memory/copy_queue.h"
#include "memory/huge_buffer.h"

namespace tandem::memory {
namespace {

// Anonymous private mapping reserved without committing: pages are committed as they are first
// written, so a 22 GiB "VRAM" budget on a development box costs only what is actually used.
class mapped_region final : public region {
 public:
  static std::unique_ptr<region> make(tier t, size_t bytes) {
    const size_t size = std::max<size_t>((bytes + k_huge_page - 1) / k_huge_page * k_huge_page, k_huge_page);
    // One huge page more than needed, so the region can start on a 2 MiB boundary: transparent
    // huge pages only back aligned 2 MiB ranges.
    void* p = ::mmap(nullptr, size + k_huge_page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
      throw std::runtime_error("cpu backend: cannot reserve " + std::to_string(bytes) + " bytes for the " + std::string(tier_name(t)) +
                               " tier: " + std::strerror(errno));
    auto* base = static_cast<std::byte*>(p);
    auto* aligned = reinterpret_cast<std::byte*>((reinterpret_cast<uintptr_t>(base) + k_huge_page - 1) / k_huge_page * k_huge_page);
    // Weights are streamed by the kernels and copied in bulk: huge pages save a TLB miss per
    // 4 KiB (a hint only).
    ::madvise(aligned, size, MADV_HUGEPAGE);
    return std::unique_ptr<region>(new mapped_region(aligned, bytes, base, size + k_huge_page, t));
  }
  ~mapped_region() override { ::munmap(mapping_, mapped_); }

 private:
  mapped_region(std::byte* p, size_t bytes, std::byte* mapping, size_t mapped, tier t) : region(p, bytes, t), mapping_(mapping), mapped_(mapped) {}
  std::byte* mapping_;
  size_t mapped_;
};

uint64_t installed_ram() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

class cpu_backend final : public backend {
 public:
  explicit cpu_backend(double link_gbps) : link_gbps_(link_gbps), to_device_(link_gbps * 1e9), to_host_(link_gbps * 1e9) {}

  backend_info info() const override { return {"cpu (device tier simulated in RAM)", true, installed_ram(), link_gbps_}; }
  std::unique_ptr<region> allocate(tier t, size_t bytes) override {
    if (t == tier::disk) throw std::invalid_argument("cpu backend: the disk tier is not allocated");
    return mapped_region::make(t, bytes);
  }
  bool device_host_addressable() const override { return true; }
  event copy(copy_kind kind, void* dst, const void* src, size_t bytes) override {
    return (kind == copy_kind::host_to_device ? to_device_ : to_host_).enqueue(dst, src, bytes);
  }
  void synchronize() override {
    to_device_.drain();
    to_host_.drain();
  }

 private:
  double link_gbps_;
  copy_queue to_device_, to_host_;
};

}  // namespace

std::unique_ptr<backend> make_cpu_backend(double link_gbps) {
  if (!std::isfinite(link_gbps) || link_gbps < 0)
    throw std::invalid_argument("link_gbps must be a finite number >= 0, got " + std::to_string(link_gbps));
  return std::make_unique<cpu_backend>(link_gbps);
}

}  // namespace tandem::memory
