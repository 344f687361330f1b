#include "models/forward.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quants.h"
#include "models/weight_plan.h"

namespace tandem::models {
namespace {

// A segment held for the forward pass, released when the holder goes out of scope: on the
// normal path and when a kernel's exception leaves the pass half done, so no lease outlives it.
class segment_hold {
 public:
  segment_hold() = default;
  segment_hold(weight_residency* r, int seg) : r_(r), seg_(seg) {}
  segment_hold(segment_hold&& o) noexcept : r_(std::exchange(o.r_, nullptr)), seg_(o.seg_) {}
  segment_hold& operator=(segment_hold&& o) noexcept {
    if (this != &o) {
      reset();
      r_ = std::exchange(o.r_, nullptr);
      seg_ = o.seg_;
    }
    return *this;
  }
  segment_hold(const segment_hold&) = delete;
  segment_hold& operator=(const segment_hold&) = delete;
  ~segment_hold() { reset(); }
  void reset() {
    if (r_) std::exchange(r_, nullptr)->release(seg_);
  }

 private:
  weight_residency* r_ = nullptr;
  int seg_ = 0;
};


using kernels::cpu::matmul;
using kernels::cpu::sum_order;

void project(const weight_view& w, const float* x, int64_t n, float* y, kernels::cpu::thread_pool* pool,
             sum_order order) {
  matmul(w.type, w.data, w.rows, w.cols, x, n, y, pool, w.layout, order);
}

// The gate and up projections of x and their SwiGLU, in one pass over the pool (into ya).
void project_swiglu(const weight_view& a, float* ya, const weight_view& b, float* yb, const float* x, int64_t n,
                    kernels::cpu::thread_pool* pool, sum_order order, kernels::cpu::swiglu_exp exp) {
  kernels::cpu::matmul_swiglu({a.type, a.data, a.rows, ya, a.layout, order}, {b.type, b.data, b.rows, yb, b.layout, order},
                              a.cols, x, n, pool, exp);
}

// Projections of one input through three matrices (Q, K, V) in one pass over the pool; the
// matrices share their column count (the input width).
void project3(const weight_view& a, float* ya, const weight_view& b, float* yb, const weight_view& c, float* yc,
              const float* x, int64_t n, kernels::cpu::thread_pool* pool, sum_order order) {
  const kernels::cpu::matmul_job jobs[3] = {{a.type, a.data, a.rows, ya, a.layout, order},
                                            {b.type, b.data, b.rows, yb, b.layout, order},
                                            {c.type, c.data, c.rows, yc, c.layout, order}};
  kernels::cpu::matmul_many(jobs, 3, a.cols, x, n, pool);
}

// Calls fn(r0, r1, fast) for each run [r0, r1) of consecutive rows with the same fast(r): the
// rows of the server's arithmetic (set_prompt_end) and the others go through separate calls,
// so no row's arithmetic depends on what shares its pass. One run, one call, in the usual case.
template <class Fast, class Fn>
void by_arithmetic(int64_t n, Fast&& fast, Fn&& fn) {
  for (int64_t r0 = 0; r0 < n;) {
    int64_t r1 = r0 + 1;
    while (r1 < n && fast(r1) == fast(r0)) ++r1;
    fn(r0, r1, fast(r0));
    r0 = r1;
  }
}
sum_order order_for(bool fast) { return fast ? sum_order::tile : sum_order::ggml; }

void add_bias(float* y, const float* b, int64_t n_rows, int64_t dim) {
  if (!b) return;
  for (int64_t r = 0; r < n_rows; ++r)
    for (int64_t i = 0; i < dim; ++i) y[r * dim + i] += b[i];
}

kernels::cpu::rope_params make_rope(const model_config& c, const model_weights& w) {
  kernels::cpu::rope_params r;
  r.n_rot = c.n_rot;
  r.freq_base = c.rope_base;
  r.pairing = c.rope_pairing;
  r.freq_factors = w.rope_freqs;
  r.n_ctx_orig = static_cast<int>(c.rope_orig_ctx);
  if (c.rope_scaling != rope_scaling_type::none) r.freq_scale = 1.0f / c.rope_scale_factor;
  if (c.rope_scaling == rope_scaling_type::yarn) {
    r.ext_factor = 1.0f;
    r.attn_factor = c.yarn_attn_factor;
    r.beta_fast = c.yarn_beta_fast;
    r.beta_slow = c.yarn_beta_slow;
  }
  return r;
}

size_t kv_elem_bytes(kernels::cpu::kv_type t) { return t == kernels::cpu::kv_type::f16 ? 2 : 4; }

uint64_t physical_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<uint64_t>(pages) * static_cast<uint64_t>(page) : 0;
}

// Whole contents of a small (pseudo-)file, or nullopt when it cannot be read.
std::optional<std::string> read_text(const std::filesystem::path& p) {
  std::ifstream in(p);
  if (!in) return std::nullopt;
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::optional<uint64_t> parse_u64(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  uint64_t v = 0;
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || end == s.data()) return std::nullopt;
  return v;
}

// The number after "key" at the start of a line of a "key value" file (meminfo, memory.stat).
std::optional<uint64_t> line_value(std::string_view text, std::string_view key) {
  for (size_t at = 0; at < text.size();) {
    const size_t eol = std::min(text.find('\n', at), text.size());
    const auto line = text.substr(at, eol - at);
    if (line.substr(0, key.size()) == key) return parse_u64(line.substr(key.size()));
    at = eol + 1;
  }
  return std::nullopt;
}

// One cgroup hierarchy's memory files: v2 (unified) or v1 (the memory controller's own).
struct cgroup_files {
  bool v2;
  const char* root;           // mount point
  const char* limit;          // limit file; v2 writes "max" for none, v1 a huge number
  const char* usage;          // usage, page cache included
  const char* inactive_file;  // memory.stat key of the inactive page cache (hierarchical)
};
constexpr cgroup_files k_cgroup_v2{true, "/sys/fs/cgroup", "memory.max", "memory.current", "inactive_file "};
constexpr cgroup_files k_cgroup_v1{false, "/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.usage_in_bytes", "total_inactive_file "};

// The process's path in a hierarchy from /proc/self/cgroup ("0::/a/b" for v2,
// "4:memory:/a/b" for v1), relative; empty when absent or the root.
std::filesystem::path cgroup_path(std::string_view self, bool v2) {
  for (size_t at = 0; at < self.size();) {
    const size_t eol = std::min(self.find('\n', at), self.size());
    const auto line = self.substr(at, eol - at);
    at = eol + 1;
    const size_t c1 = line.find(':'), c2 = c1 == std::string_view::npos ? c1 : line.find(':', c1 + 1);
    if (c2 == std::string_view::npos) continue;
    const auto controllers = line.substr(c1 + 1, c2 - c1 - 1);  // comma-separated; empty for v2
    bool match = v2 && line.substr(0, c1) == "0" && controllers.empty();
    for (size_t c = 0; !v2 && !match && c <= controllers.size();) {
      const size_t comma = std::min(controllers.find(',', c), controllers.size());
      match = controllers.substr(c, comma - c) == "memory";
      c = comma + 1;
    }
    if (match) return std::filesystem::path(std::string(line.substr(c2 + 1))).lexically_normal().relative_path();
  }
  return {};
}

// The least free memory over the process's cgroup and its ancestors (a child's limit does not
// lift a parent's). Free = limit - (usage - inactive_file): the working set as container
// runtimes count it, since inactive page cache is reclaimed before anything is killed.
std::optional<uint64_t> cgroup_free_bytes(std::string_view self, const cgroup_files& files) {
  namespace fs = std::filesystem;
  const fs::path root = files.root;
  const auto rel = cgroup_path(self, files.v2);
  fs::path dir = rel.empty() ? root : root / rel;
  std::error_code ec;
  if (!fs::is_directory(dir, ec)) dir = root;  // a cgroup namespace can hide the path
  std::optional<uint64_t> best;
  for (;; dir = dir.parent_path()) {
    if (const auto limit = parse_cgroup_memory_max(read_text(dir / files.limit).value_or(""))) {
      const uint64_t usage = parse_u64(read_text(dir / files.usage).value_or("")).value_or(0);
      const uint64_t inactive = line_value(read_text(dir / "memory.stat").value_or(""), files.inactive_file).value_or(0);
      const uint64_t working = usage - std::min(usage, inactive);
      const uint64_t free = *limit > working ? *limit - working : 0;
      best = best ? std::min(*best, free) : free;
    }
    if (dir.string().size() <= root.string().size()) break;  // root done (or a path that escaped it)
  }
  return best;
}

std::optional<uint64_t> cgroup_free_bytes() {
  const auto self = read_text("/proc/self/cgroup");
  if (!self) return std::nullopt;
  std::optional<uint64_t> best;
  for (const auto* files : {&k_cgroup_v2, &k_cgroup_v1})
    if (const auto v = cgroup_free_bytes(*self, *files)) best = best ? std::min(*best, *v) : *v;
  return best;
}

// RLIMIT_AS counts address space, not memory: what is left is the limit minus what the
// process has mapped already (first field of /proc/self/statm, in pages).
std::optional<uint64_t> address_space_free_bytes() {
  rlimit rl{};
  if (::getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return std::nullopt;
  const auto limit = static_cast<uint64_t>(rl.rlim_cur);
  const long page = ::sysconf(_SC_PAGE_SIZE);
  const auto pages = parse_u64(read_text("/proc/self/statm").value_or(""));
  if (!pages || page <= 0) return limit;
  const uint64_t used = *pages * static_cast<uint64_t>(page);
  return limit > used ? limit - used : 0;
}

// Every allocation a context makes at construction, computed before any of it is made.
struct context_sizes {
  int64_t n_ctx = 0;
  int64_t n_seq = 1;
  int64_t rows = 0;  // scratch rows: max_batch clamped to [1, n_ctx], at least n_seq
  uint64_t kv = 0, scratch = 0, logits = 0;
  bool own_scratch = true;  // false: the caller provides it (context_params::scratch)
  uint64_t total() const { return kv + (own_scratch ? scratch : 0) + logits; }
};

int64_t resolve_n_ctx(const model_config& c, const context_params& p) {
  return p.n_ctx != 0 ? p.n_ctx : std::min(c.n_ctx_train, k_default_context);  // negative: refused by the caller
}

context_sizes size_context(const model_config& c, const context_params& p) {
  context_sizes s;
  s.n_ctx = resolve_n_ctx(c, p);
  if (s.n_ctx < 1 || s.n_ctx > k_max_context)
    throw std::invalid_argument("context size " + std::to_string(s.n_ctx) + " is outside [1, " + std::to_string(k_max_context) + "]");
  if (p.n_seq < 1 || p.n_seq > k_max_sequences)
    throw std::invalid_argument("sequence count " + std::to_string(p.n_seq) + " is outside [1, " + std::to_string(k_max_sequences) + "]");
  s.n_seq = p.n_seq;
  s.rows = std::max(std::clamp<int64_t>(p.max_batch, 1, s.n_ctx), s.n_seq);
  // n_seq <= 2^8 and one sequence's cache < 2^56 bytes (kv_cache_bytes): products below are
  // checked against that before multiplying.
  const uint64_t one = kv_cache_bytes(c, s.n_ctx, p.kv);
  if (one > (UINT64_MAX >> 9))
    throw std::invalid_argument("a KV cache of " + std::to_string(s.n_ctx) + " positions is too large");
  s.kv = p.kv_pool ? 0 : one * static_cast<uint64_t>(s.n_seq);
  // Per row: x and xb [n_embd], q and attn [q_dim], k and v [kv_dim], ff_gate and ff_up [n_ff],
  // RoPE's cos/sin [head_dim at most]. The config caps (q_dim <= 2^17, n_ff <= 2^18) and
  // rows <= 2^24 keep this far from overflow.
  const auto per_row = static_cast<uint64_t>(2 * (c.n_embd + c.q_dim() + c.kv_dim() + c.n_ff) + c.head_dim);
  s.scratch = static_cast<uint64_t>(s.rows) * per_row * sizeof(float);
  s.own_scratch = p.scratch == nullptr;
  s.logits = static_cast<uint64_t>(c.n_vocab) * static_cast<uint64_t>(s.n_seq) * sizeof(float);
  return s;
}

std::string mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

}  // namespace

kernels::cpu::rope_params rope_params_of(const model_config& c, const model_weights& w) { return make_rope(c, w); }

std::optional<uint64_t> parse_meminfo_available(std::string_view meminfo) {
  const auto kib = line_value(meminfo, "MemAvailable:");
  if (!kib || *kib > UINT64_MAX / 1024) return std::nullopt;
  return *kib * 1024;
}

std::optional<uint64_t> parse_cgroup_memory_max(std::string_view memory_max) {
  // "max" (no limit) and anything malformed both mean "no number to go by".
  return parse_u64(memory_max);
}

memory_limits read_memory_limits() {
  memory_limits l;
  if (const auto text = read_text("/proc/meminfo")) l.mem_available = parse_meminfo_available(*text);
  l.cgroup_free = cgroup_free_bytes();
  l.address_space_free = address_space_free_bytes();
  l.physical = physical_memory_bytes();
  return l;
}

uint64_t usable_memory_bytes(const memory_limits& l) {
  std::optional<uint64_t> least;
  for (const auto& v : {l.mem_available, l.cgroup_free, l.address_space_free})
    if (v) least = least ? std::min(*least, *v) : *v;
  return least.value_or(l.physical);
}

uint64_t kv_cache_bytes(const model_config& c, int64_t n_ctx, kernels::cpu::kv_type kv) {
  // K and V, every layer; n_ctx <= 2^24, kv_dim <= q_dim <= 2^17 and n_layer <= 1024 keep this
  // below 2^56.
  return 2ull * static_cast<uint64_t>(c.n_layer) * static_cast<uint64_t>(n_ctx) * static_cast<uint64_t>(c.kv_dim()) *
         kv_elem_bytes(kv);
}

uint64_t kv_bytes_per_token(const model_config& c, kernels::cpu::kv_type kv) { return kv_cache_bytes(c, 1, kv); }

uint64_t forward_context::memory_bytes(const model_config& c, const context_params& p) { return size_context(c, p).total(); }
uint64_t forward_context::scratch_bytes(const model_config& c, const context_params& p) { return size_context(c, p).scratch; }

forward_context::forward_context(const model& m, const context_params& p, kernels::cpu::thread_pool* pool,
                                 weight_residency* residency)
    : model_(m), pool_(pool), residency_(residency), kv_type_(p.kv), rope_(make_rope(m.config(), m.weights())), n_vocab_(m.config().n_vocab) {
  const auto& c = m.config();
  const auto sizes = size_context(c, p);
  n_ctx_ = sizes.n_ctx;
  max_batch_ = sizes.rows;
  // The sizes follow file metadata (widths, the training context), so a file could ask for
  // far more than the process can get: refuse that with a message instead of bad_alloc or the
  // OOM killer.
  if (const uint64_t usable = usable_memory_bytes(read_memory_limits()); usable > 0 && sizes.total() > usable)
    throw std::runtime_error("a context of " + std::to_string(sizes.n_seq) + " x " + std::to_string(n_ctx_) + " tokens needs " + mib(sizes.total()) + " (KV cache " + mib(sizes.kv) +
                             ", scratch for " + std::to_string(sizes.rows) + " rows " + mib(sizes.scratch) + ", logits " + mib(sizes.logits) +
                             "), more than the " + mib(usable) + " of memory this process can get; use a smaller context size");
  kv_layer_bytes_ = static_cast<size_t>(n_ctx_ * c.kv_dim()) * kv_elem_bytes(kv_type_);
  n_layer_ = c.n_layer;
  pos_.assign(static_cast<size_t>(sizes.n_seq), 0);
  prompt_end_.assign(static_cast<size_t>(sizes.n_seq), 0);
  layer_teams_ = p.layer_teams;
  row_seq_.resize(static_cast<size_t>(max_batch_));
  runs_.reserve(static_cast<size_t>(max_batch_));  // at most one run per row: no allocation per step
  run_start_.reserve(static_cast<size_t>(max_batch_) + 1);
  step_out_.reserve(static_cast<size_t>(max_batch_));
  row_pos_.resize(static_cast<size_t>(max_batch_));
  if (p.kv_pool) {
    kv_pool_ = p.kv_pool;
    const uint64_t want = kv_bytes_per_token(c, kv_type_) * static_cast<uint64_t>(kv_pool_->block_tokens());
    if (kv_pool_->block_bytes() != want)
      throw std::invalid_argument("KV pool blocks are " + std::to_string(kv_pool_->block_bytes()) + " bytes; this model needs " + std::to_string(want) +
                                  " for " + std::to_string(kv_pool_->block_tokens()) + " positions");
    paged_part_bytes_ = static_cast<size_t>(kv_pool_->block_tokens() * c.kv_dim()) * kv_elem_bytes(kv_type_);
  } else {
    // Uninitialised: the OS commits pages as they are written. Huge pages, because decode
    // reads a layer's whole cache at every token after the weights have pushed it out of every
    // cache level, and on 4 KiB pages its key blocks missed the TLB as well (perf put attention
    // at 40% of a 1,500-token generation; 1,000 tokens of SmolLM2 went from 248-256 to 294-302
    // tok/s).
    kv_ = memory::huge_buffer(sizes.kv);
  }
  // Scratch: one uninitialised block carved up like the cache, so a context sized for long
  // prompts commits only the rows its prompts use. Every row is written before it is read.
  float* next = nullptr;
  if (p.scratch) {
    next = reinterpret_cast<float*>(p.scratch);
  } else {
    scratch_.reset(new float[sizes.scratch / sizeof(float)]);
    next = scratch_.get();
  }
  auto carve = [&](int64_t per_row) {
    float* p = next;
    next += static_cast<size_t>(max_batch_ * per_row);
    return p;
  };
  x_ = carve(c.n_embd);
  // xb_ holds normed inputs and the outputs of wo, w_down and the norm before the output head:
  // n_embd per row in every case (wo maps q_dim back to n_embd).
  xb_ = carve(c.n_embd);
  q_ = carve(c.q_dim());
  k_ = carve(c.kv_dim());
  v_ = carve(c.kv_dim());
  attn_ = carve(c.q_dim());
  ff_gate_ = carve(c.n_ff);
  ff_up_ = carve(c.n_ff);
  rope_cs_ = carve(c.head_dim);
  logits_.resize(static_cast<size_t>(n_vocab_ * sizes.n_seq));
}

void forward_context::check_seq(int64_t seq) const {
  if (seq < 0 || seq >= n_seq())
    throw std::invalid_argument("sequence " + std::to_string(seq) + " is outside [0, " + std::to_string(n_seq()) + ")");
}

void forward_context::reset(int64_t seq) {
  check_seq(seq);
  pos_[static_cast<size_t>(seq)] = 0;
  prompt_end_[static_cast<size_t>(seq)] = 0;
}

void forward_context::set_prompt_end(int64_t seq, int64_t end) {
  check_seq(seq);
  prompt_end_[static_cast<size_t>(seq)] = std::max<int64_t>(end, 0);
}

void forward_context::truncate(int64_t pos, int64_t seq) {
  check_seq(seq);
  int64_t& p = pos_[static_cast<size_t>(seq)];
  if (pos < 0 || pos > p) throw std::invalid_argument("truncate: position " + std::to_string(pos) + " is outside [0, " + std::to_string(p) + "]");
  p = pos;
}

void forward_context::assume(int64_t pos, int64_t seq) {
  check_seq(seq);
  check_assume(pos, seq, pos_[static_cast<size_t>(seq)], n_ctx_, kv_pool_ ? kv_pool_->capacity(seq) : -1);
  pos_[static_cast<size_t>(seq)] = pos;
}

void forward_context::eval(std::span<const int32_t> tokens, bool all_logits, int64_t seq) {
  if (tokens.empty()) return;
  check_seq(seq);
  for (const int32_t t : tokens)
    if (t < 0 || t >= n_vocab_) throw std::invalid_argument("token id " + std::to_string(t) + " is outside the vocabulary (" + std::to_string(n_vocab_) + ")");
  const int64_t pos0 = pos_[static_cast<size_t>(seq)];
  if (pos0 + static_cast<int64_t>(tokens.size()) > n_ctx_)
    throw std::invalid_argument("context overflow: " + std::to_string(pos0) + " + " + std::to_string(tokens.size()) + " tokens exceed the context size " + std::to_string(n_ctx_));
  const auto n = static_cast<int64_t>(tokens.size());
  check_capacity(seq, pos0 + n);
  if (all_logits && logits_.size() < static_cast<size_t>(n * n_vocab_)) logits_.resize(static_cast<size_t>(n * n_vocab_));
  n_logit_rows_ = all_logits ? n : 1;
  for (int64_t done = 0; done < n; done += max_batch_) {
    const int64_t chunk = std::min(max_batch_, n - done);
    for (int64_t r = 0; r < chunk; ++r) {
      row_seq_[static_cast<size_t>(r)] = seq;
      row_pos_[static_cast<size_t>(r)] = pos0 + done + r;
    }
    // Without all_logits only the very last token's logits are kept, so earlier chunks skip
    // the output head (an n_vocab x n_embd matmul per chunk).
    const bool last = done + chunk == n;
    float* out = all_logits ? logits_.data() + done * n_vocab_ : last ? logits_.data() : nullptr;
    const int64_t last_row = chunk - 1;
    eval_chunk(tokens.data() + done, row_seq_.data(), row_pos_.data(), chunk, out, all_logits ? nullptr : &last_row, 1);
  }
}

void forward_context::decode(std::span<const int32_t> tokens, std::span<const int64_t> seqs) {
  if (tokens.size() != seqs.size())
    throw std::invalid_argument("decode: " + std::to_string(tokens.size()) + " tokens for " + std::to_string(seqs.size()) + " sequences");
  if (tokens.empty()) return;
  const auto n = static_cast<int64_t>(tokens.size());
  if (n > n_seq()) throw std::invalid_argument("decode: " + std::to_string(n) + " rows for " + std::to_string(n_seq()) + " sequences");
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = seqs[static_cast<size_t>(i)];
    check_seq(s);
    for (int64_t j = 0; j < i; ++j)
      if (seqs[static_cast<size_t>(j)] == s) throw std::invalid_argument("decode: sequence " + std::to_string(s) + " is listed twice");
    const int32_t t = tokens[static_cast<size_t>(i)];
    if (t < 0 || t >= n_vocab_) throw std::invalid_argument("token id " + std::to_string(t) + " is outside the vocabulary (" + std::to_string(n_vocab_) + ")");
    if (pos_[static_cast<size_t>(s)] >= n_ctx_)
      throw std::invalid_argument("context overflow: sequence " + std::to_string(s) + " is full (" + std::to_string(n_ctx_) + " tokens)");
    check_capacity(s, pos_[static_cast<size_t>(s)] + 1);
  }
  // n <= n_seq <= max_batch_: one chunk.
  for (int64_t i = 0; i < n; ++i) {
    row_seq_[static_cast<size_t>(i)] = seqs[static_cast<size_t>(i)];
    row_pos_[static_cast<size_t>(i)] = pos_[static_cast<size_t>(seqs[static_cast<size_t>(i)])];
  }
  n_logit_rows_ = n;
  eval_chunk(tokens.data(), row_seq_.data(), row_pos_.data(), n, logits_.data(), nullptr, n);
}

void forward_context::step(std::span<const int32_t> tokens, std::span<const int64_t> seqs) {
  if (tokens.empty() && seqs.empty()) return;
  lay_out_step(
      tokens, seqs, n_vocab_, max_batch_,
      [this](int64_t s) {
        check_seq(s);
        return pos_[static_cast<size_t>(s)];
      },
      [this](int64_t s, int64_t need) {
        if (need > n_ctx_)
          throw std::invalid_argument("context overflow: sequence " + std::to_string(s) + " would hold " + std::to_string(need) + " of " +
                                      std::to_string(n_ctx_) + " positions");
        check_capacity(s, need);
      },
      step_out_, row_pos_.data());
  const auto n = static_cast<int64_t>(tokens.size());
  for (int64_t i = 0; i < n; ++i) row_seq_[static_cast<size_t>(i)] = seqs[static_cast<size_t>(i)];
  const auto runs = static_cast<int64_t>(step_out_.size());
  if (logits_.size() < static_cast<size_t>(runs * n_vocab_)) logits_.resize(static_cast<size_t>(runs * n_vocab_));
  n_logit_rows_ = runs;
  eval_chunk(tokens.data(), row_seq_.data(), row_pos_.data(), n, logits_.data(), step_out_.data(), runs);
}

template <class Inputs>
void forward_context::decode_layer_team(const layer_weights& L, int64_t n, bool fast, float attn_scale,
                                        Inputs& attention_inputs) {
  const auto& c = model_.config();
  const int64_t D = c.n_embd, Q = c.q_dim(), F = c.n_ff;
  const sum_order order = order_for(fast);
  using kernels::cpu::matmul_job;
  const matmul_job qkv[3] = {{L.wq.type, L.wq.data, L.wq.rows, q_, L.wq.layout, order},
                             {L.wk.type, L.wk.data, L.wk.rows, k_, L.wk.layout, order},
                             {L.wv.type, L.wv.data, L.wv.rows, v_, L.wv.layout, order}};
  const matmul_job wo{L.wo.type, L.wo.data, L.wo.rows, xb_, L.wo.layout, order};
  const matmul_job gate{L.w_gate.type, L.w_gate.data, L.w_gate.rows, ff_gate_, L.w_gate.layout, order};
  const matmul_job up{L.w_up.type, L.w_up.data, L.w_up.rows, ff_up_, L.w_up.layout, order};
  const matmul_job down{L.w_down.type, L.w_down.data, L.w_down.rows, xb_, L.w_down.layout, order};
  const auto exp = fast ? kernels::cpu::swiglu_exp::vector : kernels::cpu::swiglu_exp::expf;
  // Each member norms x into a buffer of its own and keeps its own copy of the residual
  // stream between the blocks, so no step waits for one thread to norm for all; x_ is
  // written only in the last step, each member its rows of the down product, after every
  // member has read it.
  pool_->run_team([&](int member, kernels::cpu::team& t) {
    const kernels::cpu::team_part part{member, t.members()};
    thread_local std::vector<float> own;
    if (own.size() < static_cast<size_t>(2 * n * D)) own.resize(static_cast<size_t>(2 * n * D));
    float* const xn = own.data();
    float* const xr = xn + n * D;
    for (int64_t r = 0; r < n; ++r) kernels::cpu::rms_norm(x_ + r * D, L.attn_norm, xn + r * D, D, c.rms_eps);
    kernels::cpu::matmul_many_part(qkv, 3, D, xn, n, part);
    t.sync(member);
    // This member's runs: those whose first row falls in its share of the rows.
    auto first_run_from = [&](int64_t row) {
      return static_cast<int64_t>(std::lower_bound(run_start_.begin(), run_start_.end() - 1, row) - run_start_.begin());
    };
    const int64_t m = member, count = t.members();
    attention_inputs(first_run_from((m * n + count - 1) / count), first_run_from(((m + 1) * n + count - 1) / count));
    t.sync(member);
    kernels::cpu::attention_many_part(runs_.data(), static_cast<int64_t>(runs_.size()), kv_type_, static_cast<int>(c.n_head),
                                      static_cast<int>(c.n_head_kv), static_cast<int>(c.head_dim), attn_scale, part);
    t.sync(member);
    kernels::cpu::matmul_many_part(&wo, 1, Q, attn_, n, part);
    t.sync(member);
    for (int64_t i = 0; i < n * D; ++i) xr[i] = x_[i] + xb_[i];
    for (int64_t r = 0; r < n; ++r) kernels::cpu::rms_norm(xr + r * D, L.ffn_norm, xn + r * D, D, c.rms_eps);
    kernels::cpu::matmul_swiglu_part(gate, up, D, xn, n, part, exp);
    t.sync(member);
    const kernels::cpu::row_span rows = kernels::cpu::matmul_many_part(&down, 1, F, ff_gate_, n, part);
    for (int64_t r = 0; r < n; ++r)
      for (int64_t i = rows.begin; i < rows.end; ++i) x_[r * D + i] = xr[r * D + i] + xb_[r * D + i];
  });
}

void forward_context::eval_chunk(const int32_t* tokens, const int64_t* seqs, const int64_t* positions, int64_t n,
                                 float* logits, const int64_t* out_rows, int64_t n_out) {
  const auto& c = model_.config();
  const auto& w = model_.weights();
  const int64_t D = c.n_embd, Q = c.q_dim(), KV = c.kv_dim(), F = c.n_ff, hd = c.head_dim;

  const weight_plan& plan = model_.plan();
  const int depth = residency_ ? residency_->prefetch_depth() : 0;
  if (residency_) {
    // The first layers start copying while the rows are looked up, piece by piece.
    for (int d = 0; d < depth && d < c.n_layer; ++d) residency_->prefetch(plan.layer_segment(d));
    for (const auto& piece : plan.token_embd) {
      const int64_t end = piece.row0 + piece.m.view.rows;
      bool wanted = false;
      for (int64_t r = 0; r < n && !wanted; ++r) wanted = tokens[r] >= piece.row0 && tokens[r] < end;
      if (!wanted) continue;
      const weight_view embd = bind_matrix_at(piece.m, hold(piece.segment));
      const segment_hold held(residency_, piece.segment);
      for (int64_t r = 0; r < n; ++r)
        if (tokens[r] >= piece.row0 && tokens[r] < end) dequantize_weight_row(embd, tokens[r] - piece.row0, x_ + r * D);
    }
  } else {
    for (int64_t r = 0; r < n; ++r) dequantize_weight_row(w.token_embd, tokens[r], x_ + r * D);
  }

  const float attn_scale = 1.0f / std::sqrt(static_cast<float>(hd));
  // RoPE's cos/sin of each row's position, once for every layer's q and k.
  for (int64_t r = 0; r < n; ++r) kernels::cpu::rope_table(positions[r], static_cast<int>(hd), rope_, rope_cs_ + r * hd);
  // Rows of the server's arithmetic (set_prompt_end): tiled attention, SwiGLU's vector e^x,
  // packed Q4_1/Q5_1 in the tile's order.
  auto fast = [&](int64_t r) { return positions[r] < prompt_end_[static_cast<size_t>(seqs[r])]; };
  // Attention runs: consecutive rows of one sequence (the whole chunk for a prompt, one row per
  // sequence in a batched decode), the same in every layer. run_start_ holds each run's first
  // row and n after the last; both vectors were reserved for max_batch_ rows.
  run_start_.clear();
  for (int64_t r = 0; r < n; ++r)
    if (r == 0 || seqs[r] != seqs[r - 1]) run_start_.push_back(r);
  runs_.resize(run_start_.size());
  run_start_.push_back(n);
  // Decode steps (up to k_team_max_rows rows, all of one arithmetic) run each layer as one
  // team job (context_params::layer_teams).
  bool team_rows = layer_teams_ && n <= k_team_max_rows && pool_ && pool_->size() > 1;
  for (int64_t r = 1; r < n && team_rows; ++r) team_rows = fast(r) == fast(0);
  layer_weights leased;
  const std::byte* last_layer = nullptr;  // held past the loop: the output norm is in it
  segment_hold layer_held;
  for (int64_t l = 0; l < c.n_layer; ++l) {
    const int seg = plan.layer_segment(l);
    if (residency_) {
      last_layer = hold(seg);
      layer_held = segment_hold(residency_, seg);  // releases the previous layer's
      leased = bind_layer(plan.layers[static_cast<size_t>(l)], last_layer);
      // The next segments copy while this one computes.
      for (int d = 1; d <= depth && seg + d <= plan.last_segment(); ++d) residency_->prefetch(seg + d);
    }
    const auto& L = residency_ ? leased : w.layers[l];
    // Everything between the Q/K/V products and attention for runs [i0, i1) (run_start_):
    // biases, QK norms, RoPE, the KV store, and each run's attention_run. Runs are rows of
    // distinct sequences, so parts of them may go to different threads.
    auto attention_inputs = [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t r0 = run_start_[static_cast<size_t>(i)], r1 = run_start_[static_cast<size_t>(i) + 1];
        const int64_t s = seqs[r0], len = r1 - r0, p0 = positions[r0];
        add_bias(q_ + r0 * Q, L.bq, len, Q);
        add_bias(k_ + r0 * KV, L.bk, len, KV);
        add_bias(v_ + r0 * KV, L.bv, len, KV);
        for (int64_t r = r0; r < r1; ++r) {
          float* q = q_ + r * Q;
          float* k = k_ + r * KV;
          if (L.q_norm) {
            for (int64_t h = 0; h < c.n_head; ++h) kernels::cpu::rms_norm(q + h * hd, L.q_norm, q + h * hd, hd, c.rms_eps);
            for (int64_t h = 0; h < c.n_head_kv; ++h) kernels::cpu::rms_norm(k + h * hd, L.k_norm, k + h * hd, hd, c.rms_eps);
          }
          const float* cs = rope_cs_ + r * hd;
          kernels::cpu::rope_apply(q, static_cast<int>(c.n_head), static_cast<int>(hd), cs, rope_);
          kernels::cpu::rope_apply(k, static_cast<int>(c.n_head_kv), static_cast<int>(hd), cs, rope_);
        }
        kernels::cpu::attention_run& run = runs_[static_cast<size_t>(i)];
        if (kv_pool_) {
          paged_store(s, l, p0, r0, len);
          const int64_t elem = static_cast<int64_t>(kv_elem_bytes(kv_type_));
          const kernels::cpu::kv_pages pages{kv_pool_->table(s).data(), kv_pool_->block_tokens(), static_cast<int64_t>(kv_pool_->block_bytes()) / elem};
          run = {q_ + r0 * Q, len, p0, kv_pool_->data() + paged_offset(l, 0), kv_pool_->data() + paged_offset(l, 1), attn_ + r0 * Q, pages};
        } else {
          kernels::cpu::kv_store(k_cache(s, l), kv_type_, p0, k_ + r0 * KV, len, KV);
          kernels::cpu::kv_store(v_cache(s, l), kv_type_, p0, v_ + r0 * KV, len, KV);
          run = {q_ + r0 * Q, len, p0, k_cache(s, l), v_cache(s, l), attn_ + r0 * Q};
        }
        run.prompt_rows = std::clamp<int64_t>(prompt_end_[static_cast<size_t>(s)] - p0, 0, len);
      }
    };
    if (team_rows) {
      decode_layer_team(L, n, fast(0), attn_scale, attention_inputs);
    } else {
      // Attention block.
      for (int64_t r = 0; r < n; ++r) kernels::cpu::rms_norm(x_ + r * D, L.attn_norm, xb_ + r * D, D, c.rms_eps);
      by_arithmetic(n, fast, [&](int64_t r0, int64_t r1, bool f) {
        project3(L.wq, q_ + r0 * Q, L.wk, k_ + r0 * KV, L.wv, v_ + r0 * KV, xb_ + r0 * D, r1 - r0, pool_, order_for(f));
      });
      attention_inputs(0, static_cast<int64_t>(runs_.size()));
      kernels::cpu::attention_many(runs_.data(), static_cast<int64_t>(runs_.size()), kv_type_, static_cast<int>(c.n_head),
                                   static_cast<int>(c.n_head_kv), static_cast<int>(hd), attn_scale, pool_);
      by_arithmetic(n, fast, [&](int64_t r0, int64_t r1, bool f) {
        project(L.wo, attn_ + r0 * Q, r1 - r0, xb_ + r0 * D, pool_, order_for(f));
      });
      for (int64_t i = 0; i < n * D; ++i) x_[i] += xb_[i];

      // Feed-forward block (SwiGLU).
      for (int64_t r = 0; r < n; ++r) kernels::cpu::rms_norm(x_ + r * D, L.ffn_norm, xb_ + r * D, D, c.rms_eps);
      by_arithmetic(n, fast, [&](int64_t r0, int64_t r1, bool f) {
        // The server's rows take the vector e^x, the rest expf as llama.cpp does.
        project_swiglu(L.w_gate, ff_gate_ + r0 * F, L.w_up, ff_up_ + r0 * F, xb_ + r0 * D, r1 - r0, pool_, order_for(f),
                       f ? kernels::cpu::swiglu_exp::vector : kernels::cpu::swiglu_exp::expf);
        project(L.w_down, ff_gate_ + r0 * F, r1 - r0, xb_ + r0 * D, pool_, order_for(f));
      });
      for (int64_t i = 0; i < n * D; ++i) x_[i] += xb_[i];
    }
    if (l + 1 < c.n_layer) {
      layer_held.reset();
      if (between_layers_) between_layers_();
    }
  }

  for (int64_t r = 0; r < n; ++r) pos_[static_cast<size_t>(seqs[r])] = positions[r] + 1;
  // Output head: only the rows whose logits are wanted (out_rows, or every row), normed into
  // consecutive rows of xb_.
  const int64_t rows = out_rows ? n_out : n;
  auto row_of = [&](int64_t k) { return out_rows ? out_rows[k] : k; };
  auto fast_out = [&](int64_t k) { return fast(row_of(k)); };
  if (!residency_) {
    if (!logits) return;
    for (int64_t k = 0; k < rows; ++k) kernels::cpu::rms_norm(x_ + row_of(k) * D, w.output_norm, xb_ + k * D, D, c.rms_eps);
    by_arithmetic(rows, fast_out, [&](int64_t k0, int64_t k1, bool f) {
      project(w.output, xb_ + k0 * D, k1 - k0, logits + k0 * n_vocab_, pool_, order_for(f));
    });
    return;
  }
  if (logits) {
    const float* norm = bind_vector_at(plan.output_norm, last_layer);
    for (int64_t k = 0; k < rows; ++k) kernels::cpu::rms_norm(x_ + row_of(k) * D, norm, xb_ + k * D, D, c.rms_eps);
  }
  layer_held.reset();
  if (!logits) return;
  // The head piece by piece; a piece's logits are columns [row0, row0 + its rows) of each row.
  for (size_t i = 0; i < plan.output.size(); ++i) {
    const auto& piece = plan.output[i];
    const weight_view head = bind_matrix_at(piece.m, hold(piece.segment));
    const segment_hold held(residency_, piece.segment);
    for (int d = 1; d <= depth && i + static_cast<size_t>(d) < plan.output.size(); ++d)
      residency_->prefetch(plan.output[i + static_cast<size_t>(d)].segment);
    if (plan.output.size() == 1) {
      by_arithmetic(rows, fast_out, [&](int64_t k0, int64_t k1, bool f) {
        project(head, xb_ + k0 * D, k1 - k0, logits + k0 * n_vocab_, pool_, order_for(f));
      });
    } else {
      const int64_t pr = head.rows;
      head_scratch_.resize(static_cast<size_t>(rows * pr));
      by_arithmetic(rows, fast_out, [&](int64_t k0, int64_t k1, bool f) {
        project(head, xb_ + k0 * D, k1 - k0, head_scratch_.data() + k0 * pr, pool_, order_for(f));
      });
      for (int64_t r = 0; r < rows; ++r)
        std::copy_n(head_scratch_.data() + r * pr, pr, logits + r * n_vocab_ + piece.row0);
    }
  }
}

void forward_context::paged_store(int64_t s, int64_t layer, int64_t p0, int64_t r0, int64_t len) {
  const auto& table = kv_pool_->table(s);
  const int64_t bt = kv_pool_->block_tokens(), KV = model_.config().kv_dim();
  for (int64_t done = 0; done < len;) {
    const int64_t p = p0 + done;
    const int64_t in_block = std::min(len - done, bt - p % bt);
    std::byte* block = kv_pool_->data() + static_cast<size_t>(table[static_cast<size_t>(p / bt)]) * kv_pool_->block_bytes();
    kernels::cpu::kv_store(block + paged_offset(layer, 0), kv_type_, p % bt, k_ + (r0 + done) * KV, in_block, KV);
    kernels::cpu::kv_store(block + paged_offset(layer, 1), kv_type_, p % bt, v_ + (r0 + done) * KV, in_block, KV);
    done += in_block;
  }
}

void forward_context::check_capacity(int64_t seq, int64_t end) const {
  if (!kv_pool_ || kv_pool_->capacity(seq) >= end) return;
  throw std::invalid_argument("sequence " + std::to_string(seq) + " needs KV blocks for " + std::to_string(end) + " positions but holds " +
                              std::to_string(kv_pool_->capacity(seq)) + (kv_pool_->swapped_out(seq) ? " (swapped out)" : "") +
                              "; reserve them in the KV pool first");
}

const std::byte* forward_context::hold(int seg) {
  const std::byte* p = residency_->acquire(seg);
  if (!p)
    throw std::logic_error("forward pass: segment " + std::to_string(seg) + " of the model could not be made resident (no stream slot free)");
  return p;
}

}  // namespace tandem::models
