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
    : memory_(memory), block_tokens_(block_tokens), block_bytes_(block_bytes), stride_(block_bytes), footprint_(block_bytes) {
  check_shape(n_blocks, block_tokens, block_bytes);
  max_blocks_ = live_ = n_blocks;
  refs_.assign(static_cast<size_t>(n_blocks), 0);
  retained_.assign(static_cast<size_t>(n_blocks), 0);
  for (int32_t b = 0; b < n_blocks; ++b) free_.push_back(b);
}

kv_pool::kv_pool(arbiter* a, std::byte* memory, int32_t id_limit, int64_t block_tokens, size_t block_bytes, std::string model)
    : kv_pool(memory, id_limit, block_tokens, block_bytes) {
  arbiter_ = a;
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
  auto p = std::unique_ptr<kv_pool>(new kv_pool(&a, mem->data, n_blocks, block_tokens, block_bytes, model));
  p->device_ = *mem;
  return p;
}

std::unique_ptr<kv_pool> kv_pool::make_elastic(arbiter& a, const std::string& model, int32_t max_blocks, int32_t reserve_blocks, int64_t block_tokens,
                                               size_t block_bytes, status* why) {
  check_shape(max_blocks, block_tokens, block_bytes);
  if (reserve_blocks < 0 || reserve_blocks > max_blocks)
    throw std::invalid_argument("kv_pool: a floor of " + std::to_string(reserve_blocks) + " blocks outside [0, " + std::to_string(max_blocks) + "]");
  // Block ids are offsets into the device region in the arbiter's allocation units: every
  // allocation starts on one, so any block of any model has an id.
  const size_t unit = a.config().block_bytes;
  const uint64_t region = a.snapshot().device.capacity;
  const auto ids = static_cast<int32_t>(std::min<uint64_t>(region / unit, INT32_MAX));
  auto p = std::unique_ptr<kv_pool>(new kv_pool(&a, a.region_base(tier::device), ids, block_tokens, block_bytes, model));
  p->elastic_ = true;
  p->stride_ = unit;
  p->footprint_ = (block_bytes + unit - 1) / unit * unit;
  p->free_.clear();
  p->live_ = 0;
  p->max_blocks_ = max_blocks;
  p->reserve_blocks_ = reserve_blocks;
  std::vector<int32_t> floor;
  if (!p->take_blocks(static_cast<size_t>(reserve_blocks), floor)) {
    if (why) *why = status::no_space;
    return nullptr;
  }
  for (const int32_t b : floor) p->unref(b);  // kept free: live_ never drops below the floor
  if (why) *why = status::ok;
  return p;
}

kv_pool::~kv_pool() {
  if (!arbiter_) return;
  for (const auto& [seq, s] : swapped_) arbiter_->release(s.host);
  if (device_) arbiter_->release(*device_);
  if (!elastic_) return;
  for (size_t b = 0; b < refs_.size(); ++b)
    if (refs_[b] > 0) arbiter_->release(device_allocation(static_cast<int32_t>(b)));
  for (const int32_t b : free_) arbiter_->release(device_allocation(b));
}

allocation kv_pool::device_allocation(int32_t block) const {
  const size_t off = static_cast<size_t>(block) * stride_;
  return allocation{tier::device, off, footprint_, memory_ + off};
}

int32_t kv_pool::free_blocks() const {
  const auto kept = static_cast<int32_t>(free_.size());
  if (!elastic_) return kept;
  const uint64_t room = arbiter_->free_bytes(tier::device) / footprint_;
  return kept + static_cast<int32_t>(std::min<uint64_t>(room, static_cast<uint64_t>(max_blocks_ - live_)));
}

std::optional<int32_t> kv_pool::take_block() {
  int32_t b = -1;
  if (!free_.empty()) {
    b = free_.front();
    free_.pop_front();
  } else if (elastic_ && live_ < max_blocks_) {
    const auto mem = arbiter_->allocate(tier::device, block_bytes_, {owner_kind::kv, model_, ""});
    if (!mem) return std::nullopt;
    b = static_cast<int32_t>(mem->offset / stride_);
    ++live_;
  } else {
    return std::nullopt;
  }
  refs_[static_cast<size_t>(b)] = 1;
  return b;
}

bool kv_pool::take_blocks(size_t n, std::vector<int32_t>& out) {
  const size_t first = out.size();
  while (out.size() - first < n) {
    const auto b = take_block();
    if (!b) {
      // All or nothing: what was taken goes back.
      for (size_t i = first; i < out.size(); ++i) unref(out[i]);
      out.resize(first);
      return false;
    }
    out.push_back(*b);
  }
  return true;
}

void kv_pool::unref(int32_t block) {
  if (--refs_[static_cast<size_t>(block)] != 0) return;
  if (elastic_ && live_ > reserve_blocks_) {
    // Back to the device tier for any model's KV or weights.
    arbiter_->release(device_allocation(block));
    --live_;
    return;
  }
  free_.push_back(block);
}

status kv_pool::reserve(int64_t seq, int64_t tokens) {
  if (swapped_.count(seq)) return status::busy;
  auto& t = tables_[seq];
  const auto need = static_cast<size_t>((std::max<int64_t>(tokens, 0) + block_tokens_ - 1) / block_tokens_);
  if (need <= t.size()) return status::ok;
  if (!take_blocks(need - t.size(), t)) {
    if (t.empty()) tables_.erase(seq);
    return status::no_space;
  }
  return status::ok;
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
  if (!valid(block) || refs_[static_cast<size_t>(block)] == 0)
    throw std::logic_error("kv_pool: retain of block " + std::to_string(block) + ", which no one holds");
  ++refs_[static_cast<size_t>(block)];
  ++retained_[static_cast<size_t>(block)];
}

void kv_pool::release_block(int32_t block) {
  if (!valid(block) || retained_[static_cast<size_t>(block)] == 0)
    throw std::logic_error("kv_pool: release of block " + std::to_string(block) + ", which was not retained");
  --retained_[static_cast<size_t>(block)];
  unref(block);
}

void kv_pool::adopt(int64_t seq, const std::vector<int32_t>& blocks) {
  if (!table(seq).empty() || swapped_.count(seq)) throw std::invalid_argument("kv_pool: sequence " + std::to_string(seq) + " is not empty");
  for (const int32_t b : blocks)
    if (!valid(b) || refs_[static_cast<size_t>(b)] == 0)
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

int32_t kv_pool::swapped_blocks(int64_t seq) const {
  const auto it = swapped_.find(seq);
  return it == swapped_.end() ? 0 : it->second.blocks;
}

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
    copies.push_back(
        b.copy(copy_kind::device_to_host, host->data + static_cast<size_t>(i) * block_bytes_, block_data(t[static_cast<size_t>(i)]), block_bytes_));
  all_of(std::move(copies)).wait();
  for (const int32_t blk : t) unref(blk);
  tables_.erase(it);
  swapped_[seq] = {*host, n};
  moved_to_host_ += n;
  return status::ok;
}

status kv_pool::swap_in(int64_t seq) {
  const auto it = swapped_.find(seq);
  if (it == swapped_.end()) return status::ok;
  const int32_t n = it->second.blocks;
  std::vector<int32_t> t;
  if (!take_blocks(static_cast<size_t>(n), t)) return status::no_space;
  std::vector<event> copies;
  auto& b = arbiter_->device_backend();
  for (int32_t i = 0; i < n; ++i)
    copies.push_back(b.copy(copy_kind::host_to_device, block_data(t[static_cast<size_t>(i)]),
                            it->second.host.data + static_cast<size_t>(i) * block_bytes_, block_bytes_));
  all_of(std::move(copies)).wait();
  arbiter_->release(it->second.host);
  swapped_.erase(it);
  tables_[seq] = std::move(t);
  moved_to_device_ += n;
  return status::ok;
}

std::optional<allocation> kv_pool::stash(int32_t block) {
  if (!arbiter_ || !valid(block)) return std::nullopt;
  const auto host = arbiter_->allocate(tier::host, block_bytes_, {owner_kind::kv, model_, "prefix"});
  if (!host) return std::nullopt;
  arbiter_->device_backend().copy(copy_kind::device_to_host, host->data, block_data(block), block_bytes_).wait();
  ++moved_to_host_;
  return host;
}

std::optional<int32_t> kv_pool::unstash(const allocation& stashed) {
  if (!arbiter_) return std::nullopt;
  const auto blk = take_block();
  if (!blk) return std::nullopt;
  retained_[static_cast<size_t>(*blk)] = 1;
  arbiter_->device_backend().copy(copy_kind::host_to_device, block_data(*blk), stashed.data, block_bytes_).wait();
  ++moved_to_device_;
  return blk;
}

void kv_pool::drop_stash(const allocation& stashed) {
  if (arbiter_) arbiter_->release(stashed);
}

void kv_pool::check() const {
  const size_t n = refs_.size();
  std::vector<int32_t> held(n, 0);
  for (const auto& [seq, t] : tables_)
    for (const int32_t b : t) {
      if (!valid(b)) throw std::logic_error("kv_pool: sequence " + std::to_string(seq) + " holds block " + std::to_string(b) + " outside the pool");
      ++held[static_cast<size_t>(b)];
    }
  std::vector<int32_t> in_free(n, 0);
  for (const int32_t b : free_) ++in_free[static_cast<size_t>(b)];
  int32_t on_device = 0;
  for (size_t i = 0; i < n; ++i) {
    held[i] += retained_[i];
    const std::string b = std::to_string(i);
    if (held[i] != refs_[i])
      throw std::logic_error("kv_pool: block " + b + " has count " + std::to_string(refs_[i]) + " but " + std::to_string(held[i]) + " holders");
    if (in_free[i] > 1 || (in_free[i] == 1 && held[i] != 0))
      throw std::logic_error("kv_pool: block " + b + " is free with " + std::to_string(held[i]) + " holders");
    if (!elastic_ && held[i] == 0 && in_free[i] == 0) throw std::logic_error("kv_pool: block " + b + " is neither held nor free");
    if (held[i] > 0 || in_free[i] == 1) ++on_device;
  }
  if (on_device != live_ || live_ > max_blocks_ || (elastic_ && live_ < reserve_blocks_))
    throw std::logic_error("kv_pool: " + std::to_string(on_device) + " blocks held or free, " + std::to_string(live_) + " counted (limit " +
                           std::to_string(max_blocks_) + ", floor " + std::to_string(reserve_blocks_) + ")");
}

}  // namespace tandem::memory
