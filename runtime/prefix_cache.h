// A model's prefix cache: the full KV blocks of finished sequences in a radix tree keyed by the
// token ids each block holds, so a request that starts with the same tokens (a system prompt,
// a chat's earlier turns, an IDE file prefix) adopts those blocks instead of evaluating them
// again. The cache holds a reference on every device block it keeps (kv_pool::retain).
// Under pressure, blocks leave the device least recently used first, deepest first: each is
// copied to the host tier when the pool has one with room (a later hit copies it back into a
// fresh block, which is far cheaper than evaluating its tokens again), else dropped. When
// the host tier is full, the least recently used host copies are dropped to make room.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "memory/kv_pool.h"

namespace tandem::runtime {

class prefix_cache {
 public:
  // host_blocks: most blocks kept on the host tier (0: no spill; the pool needs an arbiter
  // with a host tier for any).
  explicit prefix_cache(memory::kv_pool& kv, int32_t host_blocks = 1 << 20);
  ~prefix_cache();  // releases every block and host copy it holds
  prefix_cache(const prefix_cache&) = delete;
  prefix_cache& operator=(const prefix_cache&) = delete;

  // Keeps the full blocks of a sequence whose KV holds `tokens` (positions 0 ..), given its
  // block table. Blocks already cached for the same tokens are kept once (a host copy gives
  // way to the sequence's device block).
  void insert(std::span<const int32_t> tokens, const std::vector<int32_t>& blocks);
  // The cached blocks of the longest prefix of `tokens` in whole blocks that leaves at least
  // one token to evaluate (a pass needs a row to give logits); blocks waiting on the host are
  // copied back into free device blocks first, made by moving other cached blocks off the
  // device if need be (the match stops where none can be had). Counts a hit or a miss.
  std::vector<int32_t> match(std::span<const int32_t> tokens);
  // How many leading whole blocks of `tokens` match() would give (on the device or waiting on
  // the host), without touching recency, counters or residency.
  int32_t peek(std::span<const int32_t> tokens) const;
  // Moves least recently used blocks off the device (to host, or dropped), skipping blocks a
  // sequence still shares (which would free nothing), until the pool has `free_wanted` free
  // blocks or nothing more can go; returns how many device blocks it gave back.
  int evict(int32_t free_wanted);
  // Device blocks evict() could give back: those no sequence shares (a walk of the tree).
  int32_t evictable() const;

  // Drops up to `n` host copies, least recently used first, for a host tier that others need
  // (a sequence's swap-out, a model's staging); returns how many went.
  int drop_host(int32_t n);

  int32_t blocks() const { return blocks_; }            // on the device
  int32_t host_blocks() const { return host_blocks_; }  // copies waiting on the host
  int64_t hits() const { return hits_; }
  int64_t misses() const { return misses_; }
  int64_t restored() const { return restored_; }  // blocks copied back from the host by matches

 private:
  struct node {
    int32_t block = -1;                      // device block, or -1
    std::optional<memory::allocation> host;  // host copy while the block is not on the device
    uint64_t last_use = 0;
    node* parent = nullptr;
    std::map<std::vector<int32_t>, std::unique_ptr<node>> children;
  };
  void release_all(node& n);
  void drop(node* n);  // n and everything below it
  node* lru(bool device);

  memory::kv_pool& kv_;
  int32_t host_cap_;
  node root_;
  uint64_t tick_ = 0;
  int32_t blocks_ = 0, host_blocks_ = 0;
  int64_t hits_ = 0, misses_ = 0, restored_ = 0;
};

}  // namespace tandem::runtime
