// Read-only memory mapping of a whole file: the "disk" tier that backs model weights.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>

namespace tandem::memory {

// Move-only RAII mapping. Throws std::runtime_error naming the path when the file cannot be
// opened or mapped. An empty file maps to an empty span (mmap of length 0 is not allowed).
class mapped_file {
 public:
  explicit mapped_file(const std::string& path);
  ~mapped_file();
  mapped_file(mapped_file&& other) noexcept;
  mapped_file& operator=(mapped_file&& other) noexcept;
  mapped_file(const mapped_file&) = delete;
  mapped_file& operator=(const mapped_file&) = delete;

  std::span<const std::byte> bytes() const { return {static_cast<const std::byte*>(data_), size_}; }
  // Lets the kernel reclaim the pages that lie wholly inside `range` (a part of bytes()), as
  // after copying or repacking them: reading them again faults them back in from the file, so
  // the bytes stay valid; only residency changes. Parts outside the mapping are ignored.
  void drop_pages(std::span<const std::byte> range) const noexcept;
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void release() noexcept;
  std::string path_;
  void* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace tandem::memory
