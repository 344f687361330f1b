#include "memory/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <utility>

namespace tandem::memory {

mapped_file::mapped_file(const std::string& path) : path_(path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw std::runtime_error(path + ": cannot open: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    throw std::runtime_error(path + ": cannot stat: " + std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw std::runtime_error(path + ": not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ > 0) {
    void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      throw std::runtime_error(path + ": mmap failed: " + std::strerror(err));
    }
    data_ = p;
  }
  ::close(fd);  // the mapping keeps the file alive
}

mapped_file::~mapped_file() { release(); }

mapped_file::mapped_file(mapped_file&& other) noexcept
    : path_(std::move(other.path_)), data_(std::exchange(other.data_, nullptr)), size_(std::exchange(other.size_, 0)) {}

mapped_file& mapped_file::operator=(mapped_file&& other) noexcept {
  if (this != &other) {
    release();
    path_ = std::move(other.path_);
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
  }
  return *this;
}

void mapped_file::drop_pages(std::span<const std::byte> range) const noexcept {
  if (!data_ || range.empty()) return;
  const auto base = reinterpret_cast<uintptr_t>(data_);
  const uintptr_t lo = std::max(reinterpret_cast<uintptr_t>(range.data()), base);
  const uintptr_t hi = std::min(reinterpret_cast<uintptr_t>(range.data()) + range.size(), base + size_);
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const uintptr_t first = (lo + page - 1) / page * page, last = hi / page * page;
  // A private read-only mapping never holds modified pages, so dropping loses nothing.
  if (first < last) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

void mapped_file::release() noexcept {
  if (data_) ::munmap(data_, size_);
  data_ = nullptr;
  size_ = 0;
}

}  // namespace tandem::memory
