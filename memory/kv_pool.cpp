#include "memory/kv_pool.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace tandem::memory {
namespace {

void check_shape(int32_t n_blocks, int64_t block_tokens, size_t block_bytes) {
  if (n_blocks < 0) throw std::invalid_argument("kv_pool: negative block count " + std::to_string(n_blocks));
  if (block_tokens <= 0 || block_tokens % 16 != 0)
    throw std::invalid_argument("kv_pool: blocks must hold a positive multiple of 16 positions, got " + std::to_string(block_tokens));
  if (block_bytes == 0) throw std::invalid_argument("kv_pool: zero block size");
}

const std::vector<int32_t> k_no_blocks;

}  // namespace

kv_pool::kv_pool(std::byte* memory, int32_t n_blocks, int64_t block_tokens, size_t block_bytes)
    : memory_(memory), n_blocks_(n_blocks), block_tokens_(block_tokens), block_bytes_(block_bytes) {
  check_shape(n_blocks, block_tokens, block_bytes);
  refs_.assign(static_cast<size_t>(n_blocks), 0);
  retained_.assign(static_cast<size_t>(n_blocks), 0);
  for (int32_t b = 0; b < n_blocks; ++b) free_.push_back(b);
}

kv_pool::kv_pool(arbiter* a, allocation device, int32_t n_blocks, int64_t block_tokens, size_t block_bytes, std::string model)
    : kv_pool(device.data, n_blocks, block_tokens, block_bytes) {
  arbiter_ = a;
  device_ = device;
  model_ = std::move(model);
}

std::unique_ptr<kv_pool> kv_pool::make(arbiter& a, const std::string& model, int32_t n_blocks, int64_t block_tokens, size_t block_bytes,
                                       status* why) {
  check_shape(n_blocks, block_tokens, block_bytes);
  const auto mem = a.allocate(tier::device, static_cast<size_t>(n_blocks) * block_bytes, {owner_kind::kv, model, ""});
  if (!mem) {
    if (why) *why = status::no_space;
    return nullptr;
  }
  if (why) *why = status::ok;
  return std::unique_ptr<kv_pool>(new kv_pool(&a, *mem, n_blocks, block_tokens, block_bytes, model));
}

kv_pool::~kv_pool() {
  if (!arbiter_) return;
  for (const auto& [seq, s] : swapped_) arbiter_->release(s.host);
  arbiter_->release(*device_);
}

status kv_pool::reserve(int64_t seq, int64_t tokens) {
  if (swapped_.count(seq)) return status::busy;
  auto& t = tables_[seq];
  const auto need = static_cast<size_t>((std::max<int64_t>(tokens, 0) + block_tokens_ - 1) / block_tokens_);
  if (need <= t.size()) return status::ok;
  if (need - t.size() > free_.size()) {
    if (t.empty()) tables_.erase(seq);
    return status::no_space;
  }
  while (t.size() < need) {
    const int32_t b = free_.front();
    free_.pop_front();
    refs_[static_cast<size_t>(b)] = 1;
    t.push_back(b);
  }
  return status::ok;
}

void kv_pool::unref(int32_t block) {
  if (--refs_[static_cast<size_t>(block)] == 0) free_.push_back(block);
}

void kv_pool::truncate(int64_t seq, int64_t tokens) {
  const auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  const auto keep = static_cast<size_t>((std::max<int64_t>(tokens, 0) + block_tokens_ - 1) / block_tokens_);
  auto& t = it->second;
  while (t.size() > keep) {
    unref(t.back());
    t.pop_back();
  }
}

void kv_pool::drop(int64_t seq) {
  if (const auto it = tables_.find(seq); it != tables_.end()) {
    for (const int32_t b : it->second) unref(b);
    tables_.erase(it);
  }
  if (const auto it = swapped_.find(seq); it != swapped_.end()) {
    arbiter_->release(it->second.host);
    swapped_.erase(it);
  }
}

void kv_pool::share_prefix(int64_t from, int64_t to, int32_t blocks) {
  const auto& src = table(from);
  if (blocks < 0 || static_cast<size_t>(blocks) > src.size())
    throw std::invalid_argument("kv_pool: sequence " + std::to_string(from) + " has " + std::to_string(src.size()) + " blocks, not " +
                                std::to_string(blocks));
  if (!table(to).empty() || swapped_.count(to)) throw std::invalid_argument("kv_pool: sequence " + std::to_string(to) + " is not empty");
  std::vector<int32_t> t(src.begin(), src.begin() + blocks);
  for (const int32_t b : t) ++refs_[static_cast<size_t>(b)];
  tables_[to] = std::move(t);
}

void kv_pool::retain(int32_t block) {
  if (block < 0 || block >= n_blocks_ || refs_[static_cast<size_t>(block)] == 0)
    throw std::logic_error("kv_pool: retain of block " + std::to_string(block) + ", which no one holds");
  ++refs_[static_cast<size_t>(block)];
  ++retained_[static_cast<size_t>(block)];
}

void kv_pool::release_block(int32_t block) {
  if (block < 0 || block >= n_blocks_ || retained_[static_cast<size_t>(block)] == 0)
    throw std::logic_error("kv_pool: release of block " + std::to_string(block) + ", which was not retained");
  --retained_[static_cast<size_t>(block)];
  unref(block);
}

void kv_pool::adopt(int64_t seq, const std::vector<int32_t>& blocks) {
  if (!table(seq).empty() || swapped_.count(seq)) throw std::invalid_argument("kv_pool: sequence " + std::to_string(seq) + " is not empty");
  for (const int32_t b : blocks)
    if (b < 0 || b >= n_blocks_ || refs_[static_cast<size_t>(b)] == 0)
      throw std::logic_error("kv_pool: adopt of block " + std::to_string(b) + ", which no one holds");
  for (const int32_t b : blocks) ++refs_[static_cast<size_t>(b)];
  tables_[seq] = blocks;
}

const std::vector<int32_t>& kv_pool::table(int64_t seq) const {
  const auto it = tables_.find(seq);
  return it == tables_.end() ? k_no_blocks : it->second;
}

int64_t kv_pool::capacity(int64_t seq) const { return static_cast<int64_t>(table(seq).size()) * block_tokens_; }

bool kv_pool::swapped_out(int64_t seq) const { return swapped_.count(seq) != 0; }

status kv_pool::swap_out(int64_t seq) {
  if (!arbiter_) return status::not_resident;
  if (swapped_.count(seq)) return status::ok;
  const auto it = tables_.find(seq);
  if (it == tables_.end() || it->second.empty()) return status::ok;  // nothing on the device to move
  const auto& t = it->second;
  const auto n = static_cast<int32_t>(t.size());
  const auto host = arbiter_->allocate(tier::host, static_cast<size_t>(n) * block_bytes_, {owner_kind::kv, model_, "swapped"});
  if (!host) return status::no_space;
  std::vector<event> copies;
  auto& b = arbiter_->device_backend();
  for (int32_t i = 0; i < n; ++i)
    copies.push_back(b.copy(copy_kind::device_to_host, host->data + static_cast<size_t>(i) * block_bytes_,
                            memory_ + static_cast<size_t>(t[static_cast<size_t>(i)]) * block_bytes_, block_bytes_));
  all_of(std::move(copies)).wait();
  for (const int32_t blk : t) unref(blk);
  tables_.erase(it);
  swapped_[seq] = {*host, n};
  return status::ok;
}

status kv_pool::swap_in(int64_t seq) {
  const auto it = swapped_.find(seq);
  if (it == swapped_.end()) return status::ok;
  const int32_t n = it->second.blocks;
  if (static_cast<size_t>(n) > free_.size()) return status::no_space;
  std::vector<int32_t> t;
  std::vector<event> copies;
  auto& b = arbiter_->device_backend();
  for (int32_t i = 0; i < n; ++i) {
    const int32_t blk = free_.front();
    free_.pop_front();
    refs_[static_cast<size_t>(blk)] = 1;
    t.push_back(blk);
    copies.push_back(b.copy(copy_kind::host_to_device, memory_ + static_cast<size_t>(blk) * block_bytes_,
                            it->second.host.data + static_cast<size_t>(i) * block_bytes_, block_bytes_));
  }
  all_of(std::move(copies)).wait();
  arbiter_->release(it->second.host);
  swapped_.erase(it);
  tables_[seq] = std::move(t);
  return status::ok;
}

std::optional<allocation> kv_pool::stash(int32_t block) {
  if (!arbiter_ || block < 0 || block >= n_blocks_) return std::nullopt;
  const auto host = arbiter_->allocate(tier::host, block_bytes_, {owner_kind::kv, model_, "prefix"});
  if (!host) return std::nullopt;
  arbiter_->device_backend().copy(copy_kind::device_to_host, host->data, memory_ + static_cast<size_t>(block) * block_bytes_, block_bytes_).wait();
  return host;
}

std::optional<int32_t> kv_pool::unstash(const allocation& stashed) {
  if (!arbiter_ || free_.empty()) return std::nullopt;
  const int32_t blk = free_.front();
  free_.pop_front();
  refs_[static_cast<size_t>(blk)] = 1;
  retained_[static_cast<size_t>(blk)] = 1;
  arbiter_->device_backend().copy(copy_kind::host_to_device, memory_ + static_cast<size_t>(blk) * block_bytes_, stashed.data, block_bytes_).wait();
  return blk;
}

void kv_pool::drop_stash(const allocation& stashed) {
  if (arbiter_) arbiter_->release(stashed);
}

void kv_pool::check() const {
  std::vector<int32_t> held(static_cast<size_t>(n_blocks_), 0);
  for (const auto& [seq, t] : tables_)
    for (const int32_t b : t) {
      if (b < 0 || b >= n_blocks_)
        throw std::logic_error("kv_pool: sequence " + std::to_string(seq) + " holds block " + std::to_string(b) + " outside the pool");
      ++held[static_cast<size_t>(b)];
    }
  std::vector<int32_t> in_free(static_cast<size_t>(n_blocks_), 0);
  for (const int32_t b : free_) ++in_free[static_cast<size_t>(b)];
  for (int32_t b = 0; b < n_blocks_; ++b) held[static_cast<size_t>(b)] += retained_[static_cast<size_t>(b)];
  for (int32_t b = 0; b < n_blocks_; ++b) {
    const auto i = static_cast<size_t>(b);
    if (held[i] != refs_[i])
      throw std::logic_error("kv_pool: block " + std::to_string(b) + " has count " + std::to_string(refs_[i]) + " but " + std::to_string(held[i]) +
                             " holders");
    if ((held[i] == 0) != (in_free[i] == 1) || in_free[i] > 1)
      throw std::logic_error("kv_pool: block " + std::to_string(b) + " is " + (in_free[i] ? "free" : "not free") + " with " +
                             std::to_string(held[i]) + " holders");
  }
}

}  // namespace tandem::memory
