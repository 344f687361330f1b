#include "memory/block_pool.h"

#include <stdexcept>
#include <string>

namespace tandem::memory {

block_pool::block_pool(size_t capacity, size_t block_bytes) : block_(block_bytes) {
  if (block_bytes == 0 || (block_bytes & (block_bytes - 1)) != 0)
    throw std::invalid_argument("block_pool: block size " + std::to_string(block_bytes) + " is not a power of two");
  capacity_ = capacity / block_ * block_;
  if (capacity_ > 0) free_[0] = capacity_;
}

std::optional<size_t> block_pool::allocate(size_t bytes) {
  const size_t need = bytes == 0 ? block_ : (bytes + block_ - 1) / block_ * block_;
  if (need < bytes) return std::nullopt;  // overflow
  for (auto it = free_.begin(); it != free_.end(); ++it) {
    if (it->second < need) continue;
    const size_t at = it->first, left = it->second - need;
    free_.erase(it);
    if (left > 0) free_[at + need] = left;
    live_[at] = need;
    used_ += need;
    return at;
  }
  return std::nullopt;
}

void block_pool::release(size_t offset) {
  const auto it = live_.find(offset);
  if (it == live_.end()) throw std::logic_error("block_pool: no allocation starts at offset " + std::to_string(offset));
  size_t at = offset, n = it->second;
  live_.erase(it);
  used_ -= n;
  // Merge with the free run after, then the one before.
  if (const auto next = free_.find(at + n); next != free_.end()) {
    n += next->second;
    free_.erase(next);
  }
  if (auto prev = free_.lower_bound(at); prev != free_.begin()) {
    --prev;
    if (prev->first + prev->second == at) {
      at = prev->first;
      n += prev->second;
      free_.erase(prev);
    }
  }
  free_[at] = n;
}

size_t block_pool::largest_free() const {
  size_t best = 0;
  for (const auto& [at, n] : free_) best = std::max(best, n);
  return best;
}

size_t block_pool::size_at(size_t offset) const {
  const auto it = live_.find(offset);
  return it == live_.end() ? 0 : it->second;
}

void block_pool::check() const {
  std::map<size_t, std::pair<size_t, bool>> all;  // offset -> (bytes, free)
  size_t live_sum = 0;
  for (const auto& [at, n] : live_) {
    all[at] = {n, false};
    live_sum += n;
  }
  for (const auto& [at, n] : free_)
    if (!all.emplace(at, std::pair{n, true}).second) throw std::logic_error("block_pool: offset " + std::to_string(at) + " is both free and live");
  if (live_sum != used_) throw std::logic_error("block_pool: used " + std::to_string(used_) + " != sum of allocations " + std::to_string(live_sum));
  size_t expect = 0;
  bool prev_free = false;
  for (const auto& [at, e] : all) {
    const auto [n, is_free] = e;
    if (at != expect) throw std::logic_error("block_pool: gap or overlap at offset " + std::to_string(at));
    if (n == 0 || n % block_ != 0) throw std::logic_error("block_pool: run at " + std::to_string(at) + " is not whole blocks");
    if (is_free && prev_free) throw std::logic_error("block_pool: free runs at " + std::to_string(at) + " are not coalesced");
    prev_free = is_free;
    expect = at + n;
  }
  if (expect != capacity_) throw std::logic_error("block_pool: runs cover " + std::to_string(expect) + " of " + std::to_string(capacity_) + " bytes");
}

}  // namespace tandem::memory
