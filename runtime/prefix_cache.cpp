#include "runtime/prefix_cache.h"

#include <algorithm>

namespace tandem::runtime {

prefix_cache::prefix_cache(memory::kv_pool& kv) : kv_(kv) {}

prefix_cache::~prefix_cache() { release_all(root_); }

void prefix_cache::release_all(node& n) {
  for (auto& [key, child] : n.children) {
    release_all(*child);
    kv_.release_block(child->block);
  }
  n.children.clear();
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
      n->block = blocks[b];
      n->parent = at;
      kv_.retain(blocks[b]);
      ++blocks_;
      it = at->children.emplace(std::move(key), std::move(n)).first;
    }
    it->second->last_use = ++tick_;
    at = it->second.get();
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
    const auto it = at->children.find(key);
    if (it == at->children.end()) break;
    at = it->second.get();
    at->last_use = ++tick_;
    out.push_back(at->block);
  }
  ++(out.empty() ? misses_ : hits_);
  return out;
}

int prefix_cache::evict(int32_t free_wanted) {
  int released = 0;
  while (kv_.free_blocks() < free_wanted && blocks_ > 0) {
    // The least recently used leaf.
    node* best = nullptr;
    std::vector<node*> stack{&root_};
    while (!stack.empty()) {
      node* n = stack.back();
      stack.pop_back();
      for (auto& [k, c] : n->children) {
        if (c->children.empty()) {
          // A block a running sequence shares frees nothing: leave it for now.
          if (kv_.refcount(c->block) == 1 && (!best || c->last_use < best->last_use)) best = c.get();
        } else {
          stack.push_back(c.get());
        }
      }
    }
    if (!best) break;  // every leaf is shared with running sequences
    node* parent = best->parent;
    kv_.release_block(best->block);
    --blocks_;
    ++released;
    for (auto it = parent->children.begin(); it != parent->children.end(); ++it)
      if (it->second.get() == best) {
        parent->children.erase(it);
        break;
      }
  }
  return released;
}

}  // namespace tandem::runtime
