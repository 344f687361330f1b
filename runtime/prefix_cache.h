// A model's prefix cache: the full KV blocks of finished sequences in a radix tree keyed by the
// token ids each block holds, so a request that starts with the same tokens (a system prompt,
// a chat's earlier turns, an IDE file prefix) adopts those blocks instead of evaluating them
// again. The cache holds a reference on every block it keeps (kv_pool::retain); under pressure
// blocks leave least recently used first, leaves before the prefixes they extend. Device tier
// only for now: spilling to host comes with the executor's memory actions.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "memory/kv_pool.h"

namespace tandem::runtime {

class prefix_cache {
 public:
  explicit prefix_cache(memory::kv_pool& kv);
  ~prefix_cache();  // releases every block it holds
  prefix_cache(const prefix_cache&) = delete;
  prefix_cache& operator=(const prefix_cache&) = delete;

  // Keeps the full blocks of a sequence whose KV holds `tokens` (positions 0 ..), given its
  // block table. Blocks already cached for the same tokens are kept once.
  void insert(std::span<const int32_t> tokens, const std::vector<int32_t>& blocks);
  // The cached blocks of the longest prefix of `tokens` in whole blocks that leaves at least
  // one token to evaluate (a pass needs a row to give logits). Counts a hit or a miss.
  std::vector<int32_t> match(std::span<const int32_t> tokens);
  // Releases least recently used blocks (leaves first, skipping blocks a sequence still
  // shares, which would free nothing) until the pool has `free_wanted` free blocks or nothing
  // more can go; returns how many it released.
  int evict(int32_t free_wanted);

  int32_t blocks() const { return blocks_; }
  int64_t hits() const { return hits_; }
  int64_t misses() const { return misses_; }

 private:
  struct node {
    int32_t block = -1;
    uint64_t last_use = 0;
    node* parent = nullptr;
    std::map<std::vector<int32_t>, std::unique_ptr<node>> children;
  };
  void release_all(node& n);

  memory::kv_pool& kv_;
  node root_;
  uint64_t tick_ = 0;
  int32_t blocks_ = 0;
  int64_t hits_ = 0, misses_ = 0;
};

}  // namespace tandem::runtime
