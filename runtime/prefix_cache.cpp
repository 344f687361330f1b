#include "runtime/prefix_cache.h"

#include <algorithm>

namespace tandem::runtime {

prefix_cache::prefix_cache(memory::kv_pool& kv, int32_t host_blocks) : kv_(kv), host_cap_(std::max(host_blocks, 0)) {}

prefix_cache::~prefix_cache() { release_all(root_); }

void prefix_cache::release_all(node& n) {
  for (auto& [key, child] : n.children) {
    release_all(*child);
    if (child->block >= 0) {
      kv_.release_block(child->block);
      --blocks_;
    }
    if (child->host) {
      kv_.drop_stash(*child->host);
      --host_blocks_;
    }
  }
  n.children.clear();
}

int prefix_cache::drop_host(int32_t n) {
  int dropped = 0;
  while (dropped < n && host_blocks_ > 0) {
    node* old = lru(false);
    if (!old) break;
    drop(old);
    ++dropped;
  }
  return dropped;
}

void prefix_cache::drop(node* n) {
  release_all(*n);
  if (n->block >= 0) {
    kv_.release_block(n->block);
    --blocks_;
  }
  if (n->host) {
    kv_.drop_stash(*n->host);
    --host_blocks_;
  }
  node* parent = n->parent;
  for (auto it = parent->children.begin(); it != parent->children.end(); ++it)
    if (it->second.get() == n) {
      parent->children.erase(it);
      break;
    }
}

void prefix_cache::insert(std::span<const int32_t> tokens, const std::vector<int32_t>& blocks) {
  const auto bt = static_cast<size_t>(kv_.block_tokens());
  node* at = &root_;
  const size_t full = std::min(tokens.size() / bt, blocks.size());
  for (size_t b = 0; b < full; ++b) {
    std::vector<int32_t> key(tokens.begin() + static_cast<long>(b * bt), tokens.begin() + static_cast<long>((b + 1) * bt));
    auto it = at->children.find(key);
    if (it == at->children.end()) {
      auto n = std::make_unique<node>();
      n->parent = at;
      it = at->children.emplace(std::move(key), std::move(n)).first;
    }
    node& n = *it->second;
    if (n.block < 0) {
      // New, or waiting on the host: the sequence's device block serves from now on.
      n.block = blocks[b];
      kv_.retain(blocks[b]);
      ++blocks_;
      if (n.host) {
        kv_.drop_stash(*n.host);
        n.host.reset();
        --host_blocks_;
      }
    }
    n.last_use = ++tick_;
    at = &n;
  }
}

std::vector<int32_t> prefix_cache::match(std::span<const int32_t> tokens) {
  const auto bt = static_cast<size_t>(kv_.block_tokens());
  std::vector<int32_t> out;
  node* at = &root_;
  // At least one token must be left for the pass to produce logits.
  const size_t usable = tokens.empty() ? 0 : (tokens.size() - 1) / bt;
  for (size_t b = 0; b < usable; ++b) {
    const std::vector<int32_t> key(tokens.begin() + static_cast<long>(b * bt), tokens.begin() + static_cast<long>((b + 1) * bt));
    auto it = at->children.find(key);
    if (it == at->children.end()) break;
    if (it->second->block < 0 && kv_.free_blocks() == 0) {
      // Room from other cached blocks, least recently used first; the path matched so far is
      // held meanwhile (a second reference makes it ineligible). Making room may drop old host
      // copies, this one among them: look it up again.
      for (const int32_t b : out) kv_.retain(b);
      evict(1);
      for (const int32_t b : out) kv_.release_block(b);
      it = at->children.find(key);
      if (it == at->children.end()) break;
    }
    node& n = *it->second;
    if (n.block < 0) {
      const auto blk = kv_.unstash(*n.host);
      if (!blk) break;  // no free block to bring it back into
      n.block = *blk;
      kv_.drop_stash(*n.host);
      n.host.reset();
      ++blocks_;
      --host_blocks_;
      ++restored_;
    }
    n.last_use = ++tick_;
    out.push_back(n.block);
    at = &n;
  }
  ++(out.empty() ? misses_ : hits_);
  return out;
}

int32_t prefix_cache::peek(std::span<const int32_t> tokens) const {
  const auto bt = static_cast<size_t>(kv_.block_tokens());
  const node* at = &root_;
  const size_t usable = tokens.empty() ? 0 : (tokens.size() - 1) / bt;
  int32_t n = 0;
  for (size_t b = 0; b < usable; ++b) {
    const std::vector<int32_t> key(tokens.begin() + static_cast<long>(b * bt), tokens.begin() + static_cast<long>((b + 1) * bt));
    const auto it = at->children.find(key);
    if (it == at->children.end()) break;
    at = it->second.get();
    ++n;
  }
  return n;
}

prefix_cache::node* prefix_cache::lru(bool device) {
  // device: the least recently used device block with no device block below it that no
  // sequence shares; else the least recently used host copy with nothing below it.
  node* best = nullptr;
  std::vector<node*> stack{&root_};
  while (!stack.empty()) {
    node* n = stack.back();
    stack.pop_back();
    bool device_below = false;
    for (auto& [k, c] : n->children) {
      stack.push_back(c.get());
      device_below = device_below || c->block >= 0;  // spill is deepest first: checking children suffices
    }
    if (n == &root_) continue;
    const bool eligible = device ? n->block >= 0 && !device_below && kv_.refcount(n->block) == 1 : n->block < 0 && n->children.empty();
    if (eligible && (!best || n->last_use < best->last_use)) best = n;
  }
  return best;
}

int32_t prefix_cache::evictable() const {
  // A block a sequence shares has its whole path shared (prefixes are adopted from the root),
  // so every unshared device block can go, deepest first.
  int32_t n = 0;
  std::vector<const node*> stack{&root_};
  while (!stack.empty()) {
    const node* x = stack.back();
    stack.pop_back();
    for (const auto& [k, c] : x->children) stack.push_back(c.get());
    if (x != &root_ && x->block >= 0 && kv_.refcount(x->block) == 1) ++n;
  }
  return n;
}

int prefix_cache::evict(int32_t free_wanted) {
  int released = 0;
  while (kv_.free_blocks() < free_wanted && blocks_ > 0) {
    node* n = lru(true);
    if (!n) break;  // every remaining block is shared with running sequences
    std::optional<memory::allocation> copy;
    if (host_cap_ > 0) {
      if (host_blocks_ >= host_cap_)
        if (node* old = lru(false)) drop(old);
      copy = host_blocks_ < host_cap_ ? kv_.stash(n->block) : std::nullopt;
      if (!copy)
        if (node* old = lru(false)) {
          drop(old);  // the host tier is full: the oldest copy makes room
          copy = kv_.stash(n->block);
        }
    }
    ++released;
    if (!copy) {
      drop(n);  // with whatever waits on the host below it
      continue;
    }
    kv_.release_block(n->block);
    n->block = -1;
    n->host = *copy;
    --blocks_;
    ++host_blocks_;
  }
  return released;
}

}  // namespace tandem::runtime
