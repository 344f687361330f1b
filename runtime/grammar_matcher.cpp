#include "runtime/grammar_matcher.h"

#include <algorithm>
#include <limits>
#include <unordered_set>

namespace tandem::runtime {

namespace {

constexpr int32_t k_unknown = -2, k_dead = -1;
constexpr size_t k_max_nodes = 1 << 14;                // DFA states kept before it is forgotten
constexpr size_t k_max_mask_bytes = size_t{64} << 20;  // token masks kept before they are dropped
constexpr size_t k_max_closure = 1 << 16;              // stacks one expansion may visit
// Stacks the expansions of one token's mask may visit in all: a grammar built to branch
// without end cannot hold the engine. Past it, what is not computed yet counts as refused.
constexpr size_t k_max_work = size_t{1} << 22;

}  // namespace

size_t grammar_matcher::config_hash::operator()(const std::vector<uint32_t>& c) const noexcept {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const uint32_t x : c) h = (h ^ x) * 0x100000001b3ull;
  return static_cast<size_t>(h ^ (h >> 29));
}

grammar_matcher::grammar_matcher(std::shared_ptr<const grammar> g, std::shared_ptr<const grammar_vocab> v) : g_(std::move(g)), v_(std::move(v)) {
  std::vector<std::vector<uint32_t>> stacks;
  for (const uint32_t alt : g_->rules[g_->root]) closure({alt}, stacks);
  current_ = from_stacks(stacks);
  if (current_ < 0) throw grammar_error("grammar: the root rule matches nothing");
  walk_.resize(v_->max_depth + 1);
}

// Expands a stack until its top is a byte set (or it is empty: the parse may end there). A
// rule reference at the end of an alternative leaves no frame behind, so repetitions (right
// recursion) keep the stack flat.
void grammar_matcher::closure(std::vector<uint32_t> stack, std::vector<std::vector<uint32_t>>& out) {
  const auto& el = g_->elements;
  std::vector<std::vector<uint32_t>> work;
  std::unordered_set<std::vector<uint32_t>, config_hash> seen;
  work.push_back(std::move(stack));
  size_t visited = 0;
  while (!work.empty() && ++visited <= k_max_closure && ++work_ <= k_max_work) {
    std::vector<uint32_t> s = std::move(work.back());
    work.pop_back();
    if (s.empty() || el[s.back()].k == grammar::kind::bytes) {
      out.push_back(std::move(s));
      continue;
    }
    if (s.size() > k_grammar_max_stack) continue;
    const uint32_t p = s.back();
    s.pop_back();
    if (el[p].k == grammar::kind::rule) {
      if (el[p + 1].k != grammar::kind::end) s.push_back(p + 1);
      for (const uint32_t alt : g_->rules[el[p].arg]) {
        auto t = s;
        t.push_back(alt);
        if (seen.insert(t).second) work.push_back(std::move(t));
      }
    } else if (seen.insert(s).second) {  // end of an alternative: back to the caller's continuation
      work.push_back(std::move(s));
    }
  }
}

int32_t grammar_matcher::from_stacks(std::vector<std::vector<uint32_t>>& stacks) {
  if (stacks.empty()) return k_dead;
  std::sort(stacks.begin(), stacks.end());
  stacks.erase(std::unique(stacks.begin(), stacks.end()), stacks.end());
  if (stacks.size() > k_grammar_max_branches) stacks.resize(k_grammar_max_branches);
  std::vector<uint32_t> config;
  for (const auto& s : stacks) {
    config.push_back(static_cast<uint32_t>(s.size()));
    config.insert(config.end(), s.begin(), s.end());
  }
  return intern(std::move(config));
}

int32_t grammar_matcher::intern(std::vector<uint32_t> config) {
  if (const auto it = index_.find(config); it != index_.end()) return it->second;
  node n;
  n.next.fill(k_unknown);
  for (size_t i = 0; i < config.size(); i += config[i] + 1) (config[i] == 0 ? n.accepting : n.open) = true;
  n.config = config;
  const auto id = static_cast<int32_t>(nodes_.size());
  nodes_.push_back(std::move(n));
  index_.emplace(std::move(config), id);
  return id;
}

int32_t grammar_matcher::compute_step(int32_t from, uint8_t byte) {
  if (work_ > k_max_work) return k_dead;  // (not kept: a later token's budget may compute it)
  std::vector<std::vector<uint32_t>> out;
  const std::vector<uint32_t> config = nodes_[static_cast<size_t>(from)].config;  // (nodes_ may grow below)
  for (size_t i = 0; i < config.size(); i += config[i] + 1) {
    const uint32_t n = config[i];
    if (n == 0) continue;
    const uint32_t top = config[i + n];
    if (!g_->sets[g_->elements[top].arg].test(byte)) continue;
    std::vector<uint32_t> s(config.begin() + static_cast<std::ptrdiff_t>(i) + 1, config.begin() + static_cast<std::ptrdiff_t>(i + n) + 1);
    s.back() = top + 1;
    closure(std::move(s), out);
  }
  const int32_t to = from_stacks(out);
  nodes_[static_cast<size_t>(from)].next[byte] = to;
  return to;
}

inline int32_t grammar_matcher::step(int32_t from, uint8_t byte) {
  const int32_t to = nodes_[static_cast<size_t>(from)].next[byte];
  return to != k_unknown ? to : compute_step(from, byte);
}

void grammar_matcher::compute_mask(int32_t n) {
  const grammar_vocab& v = *v_;
  std::vector<uint64_t> bits((static_cast<size_t>(v.n_vocab()) + 63) / 64, 0);
  work_ = 0;
  walk_[0] = n;
  const size_t count = v.byte.size();
  for (size_t i = 0; i < count;) {
    const int32_t s = step(walk_[v.depth[i] - 1u], v.byte[i]);
    if (s < 0) {
      i = v.end[i];  // nothing under this prefix
      continue;
    }
    walk_[v.depth[i]] = s;
    for (uint32_t t = v.tokens_at[i]; t < v.tokens_at[i + 1]; ++t) {
      const auto id = static_cast<uint32_t>(v.token_ids[t]);
      bits[id / 64] |= uint64_t{1} << (id % 64);
    }
    ++i;
  }
  if (nodes_[static_cast<size_t>(n)].accepting)
    for (const int32_t id : v.eog) bits[static_cast<size_t>(id) / 64] |= uint64_t{1} << (id % 64);
  nodes_[static_cast<size_t>(n)].mask = std::move(bits);
  ++masks_;
}

const std::vector<uint64_t>& grammar_matcher::allowed() {
  if (nodes_[static_cast<size_t>(current_)].mask.empty()) compute_mask(current_);
  return nodes_[static_cast<size_t>(current_)].mask;
}

bool grammar_matcher::mask(std::span<float> logits) {
  const auto& bits = allowed();
  constexpr float neg = -std::numeric_limits<float>::infinity();
  const size_t n = std::min(logits.size(), static_cast<size_t>(v_->n_vocab()));
  bool any = false;
  for (size_t w = 0; w * 64 < n; ++w) {
    const uint64_t word = bits[w];
    any = any || word != 0;
    if (word == ~uint64_t{0}) continue;
    const size_t top = std::min(n, w * 64 + 64);
    for (size_t i = w * 64; i < top; ++i)
      if (!((word >> (i % 64)) & 1)) logits[i] = neg;
  }
  for (size_t i = n; i < logits.size(); ++i) logits[i] = neg;
  return any;
}

bool grammar_matcher::accept_bytes(std::string_view bytes) {
  work_ = 0;
  int32_t s = current_;
  for (const char c : bytes) {
    s = step(s, static_cast<uint8_t>(c));
    if (s < 0) return false;
  }
  current_ = s;
  bound();
  return true;
}

bool grammar_matcher::accept(int32_t token) {
  if (token < 0 || token >= v_->n_vocab()) return false;
  if (std::find(v_->eog.begin(), v_->eog.end(), token) != v_->eog.end()) return accepting();
  const auto& piece = v_->pieces[static_cast<size_t>(token)];
  return !piece.empty() && accept_bytes(piece);
}

bool grammar_matcher::accepting() const { return nodes_[static_cast<size_t>(current_)].accepting; }

bool grammar_matcher::finished() const {
  const node& n = nodes_[static_cast<size_t>(current_)];
  return n.accepting && !n.open;
}

void grammar_matcher::bound() {
  const size_t mask_bytes = masks_ * ((static_cast<size_t>(v_->n_vocab()) + 63) / 64) * 8;
  if (nodes_.size() > k_max_nodes) {
    std::vector<uint32_t> keep = nodes_[static_cast<size_t>(current_)].config;
    nodes_.clear();
    index_.clear();
    masks_ = 0;
    current_ = intern(std::move(keep));
  } else if (mask_bytes > k_max_mask_bytes) {
    for (auto& n : nodes_) std::vector<uint64_t>().swap(n.mask);
    masks_ = 0;
  }
}

}  // namespace tandem::runtime
