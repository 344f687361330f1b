#include "memory/huge_buffer.h"

#include <sys/mman.h>

#include <cstdlib>
#include <new>

namespace tandem::memory {

void huge_buffer::free_deleter::operator()(std::byte* p) const noexcept { std::free(p); }

huge_buffer::huge_buffer(size_t bytes) : size_(bytes) {
  if (bytes == 0) return;
  const size_t alloc = (bytes + k_huge_page - 1) / k_huge_page * k_huge_page;
  data_.reset(static_cast<std::byte*>(std::aligned_alloc(k_huge_page, alloc)));
  if (!data_) throw std::bad_alloc();
  ::madvise(data_.get(), alloc, MADV_HUGEPAGE);  // advisory: a refusal only costs TLB misses
}

}  // namespace tandem::memory
