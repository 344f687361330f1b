// Carves one region of a tier into allocations of whole blocks: first fit over a free list
// that coalesces neighbours on free. Offsets, not pointers, so the accounting can be checked
// without touching the memory. Not thread-safe (the arbiter locks around it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>

namespace tandem::memory {

class block_pool {
 public:
  // `capacity` bytes in blocks of `block_bytes` (a power of two); a remainder smaller than a
  // block is not used. Throws std::invalid_argument for a block size that is not a power of two.
  block_pool(size_t capacity, size_t block_bytes);

  // Offset of `bytes` (rounded up to whole blocks, at least one) at the lowest free place, or
  // nullopt when no free run is long enough.
  std::optional<size_t> allocate(size_t bytes);
  // Returns the allocation at `offset`. Throws std::logic_error for an offset that is not the
  // start of a live allocation (a double free or a stray offset).
  void release(size_t offset);

  size_t block_bytes() const { return block_; }
  size_t capacity() const { return capacity_; }  // whole blocks only
  size_t used() const { return used_; }
  size_t free_bytes() const { return capacity_ - used_; }
  size_t largest_free() const;
  size_t allocations() const { return live_.size(); }
  // Bytes held by the allocation at `offset` (whole blocks), 0 when there is none there.
  size_t size_at(size_t offset) const;
  // Throws std::logic_error unless the free runs and live allocations tile the capacity exactly
  // without overlap, free runs are coalesced, and used() is the sum of the live ones.
  void check() const;

 private:
  size_t capacity_, block_, used_ = 0;
  std::map<size_t, size_t> free_;  // offset -> bytes, disjoint, never adjacent
  std::map<size_t, size_t> live_;  // offset -> bytes
};

}  // namespace tandem::memory
