// A heap buffer on 2 MiB boundaries with transparent huge pages requested: for large arrays
// that kernels stream (packed weights, a context's KV cache, the read-ceiling buffer), where
// 4 KiB pages would cost a TLB miss per page and stop the hardware prefetchers at every page
// boundary.
#pragma once

#include <cstddef>
#include <memory>
#include <utility>

namespace tandem::memory {

inline constexpr size_t k_huge_page = size_t{2} << 20;

class huge_buffer {
 public:
  huge_buffer() = default;
  // `bytes` bytes (rounded up to whole huge pages), uninitialised. Throws std::bad_alloc.
  explicit huge_buffer(size_t bytes);
  huge_buffer(huge_buffer&& other) noexcept : data_(std::move(other.data_)), size_(std::exchange(other.size_, 0)) {}
  huge_buffer& operator=(huge_buffer&& other) noexcept {
    data_ = std::move(other.data_);
    size_ = std::exchange(other.size_, 0);
    return *this;
  }

  std::byte* data() { return data_.get(); }
  const std::byte* data() const { return data_.get(); }
  size_t size() const { return size_; }

 private:
  struct free_deleter {
    void operator()(std::byte* p) const noexcept;
  };
  std::unique_ptr<std::byte, free_deleter> data_;
  size_t size_ = 0;
};

}  // namespace tandem::memory
