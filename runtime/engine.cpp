#include "runtime/engine.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>

#include <spdlog/spdlog.h>

#include "policy/planner.h"
#include "runtime/memory_plan.h"

namespace tandem::runtime {

using clock_type = std::chrono::steady_clock;

struct engine::active {
  std::shared_ptr<request_handle> handle;
  std::vector<int32_t> prompt;
  generation_params params;
  sampler smp;
  text_stream text;
  std::vector<int32_t> history;  // prompt + generated, for the repetition penalty
  clock_type::time_point arrived;
  size_t model = 0;
  int64_t seq = -1;       // sequence slot while running
  int64_t prefilled = 0;  // prompt tokens in the KV
  int64_t generated = 0;
  int32_t next = -1;      // the last generated token, fed in the next pass
  int64_t rows = 0;       // rows it has in the pass being formed
  finish_reason ending = finish_reason::none;  // set by the pass; retired right after it
  bool preempt = false;    // chosen as a victim in the pass being formed
  bool recompute = false;  // preempted without a host copy: its tokens are evaluated again

  active(engine_request r, size_t m, const models::tokenizer& tok)
      : handle(std::make_shared<request_handle>()),
        prompt(std::move(r.prompt)),
        params(r.params),
        smp(r.params.sampling),
        text(tok, r.params.stop),
        history(prompt),
        arrived(clock_type::now()),
        model(m) {}
};

struct engine::served {
  engine_model cfg;
  std::unique_ptr<std::byte[]> kv_memory;  // when the engine makes the pool
  std::unique_ptr<memory::kv_pool> own_kv;
  memory::kv_pool* kv = nullptr;
  std::unique_ptr<models::forward_context> ctx;
  std::deque<std::shared_ptr<active>> waiting;
  std::vector<std::shared_ptr<active>> running;  // in admission order
  std::deque<std::shared_ptr<active>> preempted;  // out of KV: swapped to host, or to recompute
  std::vector<int64_t> free_seqs;
  std::vector<int32_t> row_tokens;
  std::vector<int64_t> row_seqs;
  std::atomic<int32_t> kv_in_use{0};  // published after each iteration: the pool itself is the engine thread's
  std::atomic<int32_t> kv_cached{0};
  std::atomic<int32_t> kv_cached_host{0};
  std::atomic<int64_t> restored{0};
  std::unique_ptr<prefix_cache> cache;
  clock_type::time_point last_pass = clock_type::now();
  clock_type::time_point loaded_at{};  // when the engine last started loading it (placement by plan)
  // The ITL budget's estimates (engine_config::itl_budget): seconds of a pass of decode rows
  // only, and of one prompt row beside them; 0 until measured. Rows of the pass being run.
  double decode_pass_s = 0, prompt_row_s = 0;
  double prompt_extra_s = 0, prompt_rows_avg = 0;  // averages prompt_row_s is the ratio of
  int64_t pass_prompt_rows = 0, pass_decode_rows = 0;
  int64_t passes_with_prompts = 0;
  double arrival_rate = 0;             // requests per second, decaying (the planner's prefetch hint)
  clock_type::time_point last_arrival{};
  static constexpr double k_rate_window_s = 60;
  double rate_at(clock_type::time_point t) const {
    return arrival_rate * std::exp(-std::chrono::duration<double>(t - last_arrival).count() / k_rate_window_s);
  }
  void publish() {
    const int32_t cached = cache ? cache->blocks() : 0;
    kv_cached = cached;
    kv_cached_host = cache ? cache->host_blocks() : 0;
    restored = cache ? cache->restored() : 0;
    kv_in_use = kv->total_blocks() - kv->free_blocks() - cached;
  }
};

engine::engine(std::vector<engine_model> models, const engine_config& config)
    : config_(config), pool_(config.threads > 0 ? config.threads : kernels::cpu::default_thread_count()) {
  if (config.max_batch_tokens < 1 || config.prefill_chunk < 1)
    throw std::invalid_argument("engine: max_batch_tokens and prefill_chunk must be >= 1");
  for (auto& cfg : models) {
    if (!cfg.model || !cfg.tokenizer) throw std::invalid_argument("engine: model '" + cfg.name + "' has no model or tokenizer");
    if (cfg.context < 1 || cfg.max_sequences < 1)
      throw std::invalid_argument("engine: model '" + cfg.name + "' needs a context and max_sequences of at least 1");
    for (const auto& other : models_)
      if (cfg.kv_pool && other->cfg.kv_pool == cfg.kv_pool)
        throw std::invalid_argument("engine: models '" + other->cfg.name + "' and '" + cfg.name + "' share a KV pool; each needs its own");
    for (const auto& s : models_)
      if (s->cfg.name == cfg.name) throw std::invalid_argument("engine: model '" + cfg.name + "' is listed twice");
    if (config.roster) {
      if (!cfg.placement) throw std::invalid_argument("engine: model '" + cfg.name + "' has no placement; a roster needs one per model");
      if (!config.roster->find(cfg.name)) throw std::invalid_argument("engine: model '" + cfg.name + "' is not in the roster");
      if (!models_.empty() && &models_.front()->cfg.placement->arbiter() != &cfg.placement->arbiter())
        throw std::invalid_argument("engine: model '" + cfg.name + "' is placed in another arbiter than '" + models_.front()->cfg.name + "'");
      const auto snap = cfg.placement->arbiter().snapshot();
      if (std::none_of(snap.models.begin(), snap.models.end(), [&](const auto& m) { return m.name == cfg.name; }))
        throw std::invalid_argument("engine: model '" + cfg.name + "' is registered with the arbiter under another name");
      if (!cfg.residency) cfg.residency = cfg.placement;
    }
    auto s = std::make_unique<served>();
    s->cfg = cfg;
    const auto& c = cfg.model->config();
    constexpr int64_t bt = 16;
    const auto block = static_cast<size_t>(models::kv_bytes_per_token(c, cfg.kv) * bt);
    if (cfg.kv_pool) {
      if (cfg.kv_pool->block_bytes() != block || cfg.kv_pool->block_tokens() != bt)
        throw std::invalid_argument("engine: the KV pool of model '" + cfg.name + "' has blocks of " + std::to_string(cfg.kv_pool->block_tokens()) +
                                    " positions and " + std::to_string(cfg.kv_pool->block_bytes()) + " bytes; it needs " + std::to_string(bt) + " and " +
                                    std::to_string(block));
      // One sequence of the whole context must fit, or a preempted one could never come back.
      if (static_cast<int64_t>(cfg.kv_pool->total_blocks()) * bt < cfg.context)
        throw std::invalid_argument("engine: the KV pool of model '" + cfg.name + "' holds " + std::to_string(cfg.kv_pool->total_blocks() * bt) +
                                    " positions, less than one sequence's context of " + std::to_string(cfg.context));
      s->kv = cfg.kv_pool;
    } else {
      const auto blocks = static_cast<int32_t>(cfg.max_sequences * ((cfg.context + bt - 1) / bt));
      // Uninitialised: pages are committed as blocks are written.
      s->kv_memory.reset(new std::byte[static_cast<size_t>(blocks) * block]);
      s->own_kv = std::make_unique<memory::kv_pool>(s->kv_memory.get(), blocks, bt, block);
      s->kv = s->own_kv.get();
    }
    models::context_params cp;
    cp.n_ctx = cfg.context;
    cp.kv = cfg.kv;
    cp.n_seq = cfg.max_sequences;
    cp.max_batch = config.max_batch_tokens;
    cp.kv_pool = s->kv;
    s->ctx = std::make_unique<models::forward_context>(*cfg.model, cp, &pool_, cfg.residency);
    for (int64_t q = cfg.max_sequences - 1; q >= 0; --q) s->free_seqs.push_back(q);
    if (config.prefix_cache)
      s->cache = std::make_unique<prefix_cache>(*s->kv, config.prefix_host_blocks < 0 ? s->kv->total_blocks() : config.prefix_host_blocks);
    s->row_tokens.reserve(static_cast<size_t>(config.max_batch_tokens));
    s->row_seqs.reserve(static_cast<size_t>(config.max_batch_tokens));
    models_.push_back(std::move(s));
  }
  if (config.roster) check_placeable();
  thread_ = std::thread([this] { run(); });
}

void engine::check_placeable() const {
  // A model that cannot run even with the device to itself would leave its requests waiting
  // for ever: refuse the configuration instead.
  auto& arb = models_.front()->cfg.placement->arbiter();
  const auto snap = arb.snapshot();
  const uint64_t block = arb.config().block_bytes;
  auto rounded = [&](uint64_t b) { return (b + block - 1) / block * block; };
  uint64_t weights_on_device = 0;
  for (const auto& m : snap.models)
    for (const auto& seg : m.segments)
      if (seg.device != memory::residency::absent) weights_on_device += rounded(seg.bytes);
  const uint64_t other = snap.device.used - weights_on_device;  // KV pools, scratch, slots
  for (const auto& s : models_) {
    const auto it = std::find_if(snap.models.begin(), snap.models.end(), [&](const auto& m) { return m.name == s->cfg.name; });
    uint64_t weights = 0, largest = 0;
    for (const auto& seg : it->segments) {
      weights += rounded(seg.bytes);
      largest = std::max(largest, rounded(seg.bytes));
    }
    // Streamed, the planner wants half the weights on the device (policy/planner.h, 2b) and the
    // pass needs its stream slots.
    const uint64_t slots = static_cast<uint64_t>(s->cfg.placement->prefetch_depth() + 1) * largest;
    const uint64_t need = config_.roster->policy.stream ? std::min(weights, std::max(slots, weights / 2)) : weights;
    if (other + need > snap.device.capacity)
      throw std::invalid_argument("engine: model '" + s->cfg.name + "' cannot run on a device of " + std::to_string(snap.device.capacity) +
                                  " bytes: it needs " + std::to_string(need) + (need < weights ? " (stream slots)" : " (weights)") +
                                  " beside " + std::to_string(other) + " of KV pools and scratch");
  }
}

engine::~engine() {
  {
    std::lock_guard lock(m_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::shared_ptr<request_handle> engine::submit(engine_request r) {
  size_t m = models_.size();
  for (size_t i = 0; i < models_.size(); ++i)
    if (models_[i]->cfg.name == r.model) m = i;
  if (m == models_.size()) throw std::invalid_argument("unknown model '" + r.model + "'");
  const auto& cfg = models_[m]->cfg;
  if (r.prompt.empty()) throw std::invalid_argument("the prompt is empty");
  if (static_cast<int64_t>(r.prompt.size()) >= cfg.context)
    throw std::invalid_argument("the prompt (" + std::to_string(r.prompt.size()) + " tokens) does not fit the context of " +
                                std::to_string(cfg.context) + " tokens of model '" + cfg.name + "'");
  const int64_t vocab = cfg.model->config().n_vocab;
  for (const int32_t t : r.prompt)
    if (t < 0 || t >= vocab) throw std::invalid_argument("token id " + std::to_string(t) + " is outside the vocabulary (" + std::to_string(vocab) + ")");
  if (r.params.max_tokens < 0) throw std::invalid_argument("max_tokens must be >= 0");
  for (const auto& stop : r.params.stop)
    if (stop.empty()) throw std::invalid_argument("a stop string is empty");
  auto a = std::make_shared<active>(std::move(r), m, *cfg.tokenizer);  // the sampler validates its parameters
  auto h = a->handle;
  {
    std::lock_guard lock(m_);
    submitted_.push_back(std::move(a));
    ++in_flight_;
  }
  cv_.notify_all();
  return h;
}

void engine::drain() {
  std::unique_lock lock(m_);
  idle_cv_.wait(lock, [&] { return in_flight_ == 0; });
}

int64_t engine::preemptions() const { return preemptions_.load(); }
int64_t engine::prefix_tokens_reused() const { return prefix_reused_.load(); }

int32_t engine::kv_blocks_cached(const std::string& model) const {
  for (const auto& s : models_)
    if (s->cfg.name == model) return s->kv_cached.load();
  throw std::invalid_argument("unknown model '" + model + "'");
}

int32_t engine::kv_blocks_cached_on_host(const std::string& model) const {
  for (const auto& s : models_)
    if (s->cfg.name == model) return s->kv_cached_host.load();
  throw std::invalid_argument("unknown model '" + model + "'");
}

int64_t engine::prefix_blocks_restored() const {
  int64_t n = 0;
  for (const auto& s : models_) n += s->restored.load();
  return n;
}

int32_t engine::kv_blocks_in_use(const std::string& model) const {
  for (const auto& s : models_)
    if (s->cfg.name == model) return s->kv_in_use.load();
  throw std::invalid_argument("unknown model '" + model + "'");
}

void engine::run() {
  std::unique_lock lock(m_);
  for (;;) {
    if (stalled_) {
      // Work waits on memory, not on a caller: look again shortly (copies land, timers run).
      cv_.wait_for(lock, std::chrono::milliseconds(2), [&] { return stop_ || !submitted_.empty(); });
      stalled_ = false;
    } else {
      cv_.wait(lock, [&] {
        if (stop_ || !submitted_.empty()) return true;
        return std::any_of(models_.begin(), models_.end(),
                           [](const auto& s) { return !s->waiting.empty() || !s->running.empty() || !s->preempted.empty(); });
      });
    }
    if (stop_) break;
    try {
      iterate(lock);
    } catch (const std::exception& e) {
      // A bug or an allocation failure outside a pass: fail what is in flight rather than
      // take the process down (the pass's own errors are handled in iterate).
      if (!lock.owns_lock()) lock.lock();
      for (auto& s : models_) end_all(*s, finish_reason::error, e.what());
    }
  }
  // Shutting down: whatever is left ends as cancelled, its KV (and host copies) released, so
  // a pool the caller owns is left as it was found.
  for (auto& a : submitted_) a->handle->finish(finish_reason::cancelled);
  submitted_.clear();
  for (auto& s : models_) end_all(*s, finish_reason::cancelled, {});
}

void engine::end_all(served& s, finish_reason why, const std::string& error) {
  for (auto& a : s.running) retire(s, *a, why, error);
  for (auto& a : s.preempted) retire(s, *a, why, error);
  for (auto& a : s.waiting) retire(s, *a, why, error);
  s.running.clear();
  s.preempted.clear();
  s.waiting.clear();
}

void engine::retire(served& s, active& a, finish_reason why, const std::string& error) {
  const bool completed = why == finish_reason::length || why == finish_reason::eog || why == finish_reason::stop || why == finish_reason::context;
  if (completed)
    if (auto rest = a.text.flush(); !rest.empty()) a.handle->push(-1, std::move(rest));
  if (a.seq >= 0) {
    // A sequence that ran to its end leaves its full blocks for later prompts: its KV holds
    // the tokens of positions 0 .. pos-1 (the last sampled token was never evaluated).
    if (s.cache && completed && !s.kv->swapped_out(a.seq))
      s.cache->insert(std::span<const int32_t>(a.history.data(), static_cast<size_t>(s.ctx->pos(a.seq))), s.kv->table(a.seq));
    s.kv->drop(a.seq);
    s.ctx->reset(a.seq);
    s.free_seqs.push_back(a.seq);
    a.seq = -1;
  }
  s.publish();
  // The caller learns of the end only once its KV is free (a drained engine holds none).
  a.handle->finish(why, error);
  --in_flight_;
  if (in_flight_ == 0) idle_cv_.notify_all();
}

engine::served* engine::pick() {
  served* best = nullptr;
  double best_p = 0;
  const auto now = clock_type::now();
  for (auto& s : models_) {
    if (s->waiting.empty() && s->running.empty() && s->preempted.empty()) continue;
    // Aging by the time since the model last had a pass: every model with work is stepped
    // within a bounded time, whether its work waits, runs or was preempted.
    const double p = s->cfg.priority + config_.aging_per_s * std::chrono::duration<double>(now - s->last_pass).count();
    if (!best || p > best_p) {
      best = s.get();
      best_p = p;
    }
  }
  return best;
}

engine::served* engine::plan_and_pick() {
  const auto now = clock_type::now();
  auto& arb = models_.front()->cfg.placement->arbiter();
  std::vector<model_facts> facts;
  for (const auto& m : models_) {
    model_facts f;
    f.name = m->cfg.name;
    f.running = static_cast<int>(m->running.size());
    f.preempted = static_cast<int>(m->preempted.size());
    f.queued = static_cast<int>(m->waiting.size());
    // The oldest request waiting to start or to resume: its wait ages the model.
    for (const auto& a : m->waiting)  // the front is not always the oldest (prefer_cached_prefix)
      if (f.oldest == policy::time_point{} || a->arrived < f.oldest) f.oldest = a->arrived;
    for (const auto& a : m->preempted)
      if (f.oldest == policy::time_point{} || a->arrived < f.oldest) f.oldest = a->arrived;
    f.last_used = m->last_pass;
    f.loaded_at = m->loaded_at;
    f.arrivals_per_s = m->rate_at(now);
    facts.push_back(std::move(f));
  }
  const double link = config_.link_gb_s > 0 ? config_.link_gb_s
                      : arb.device_backend().info().link_gbps > 0 ? arb.device_backend().info().link_gbps
                                                                  : 25.0;
  const auto snap = planner_snapshot(arb.snapshot(), arb.config().block_bytes, facts, link, 2.0);
  const auto plan = policy::make_plan(*config_.roster, snap, planner_demand(facts), now);
  auto find = [&](const std::string& name) -> served* {
    for (auto& m : models_)
      if (m->cfg.name == name) return m.get();
    return nullptr;
  };
  for (const auto& act : plan.actions) {
    served* t = find(act.model);
    if (!t) continue;
    if (act.kind == policy::action_kind::preempt) {
      preempt_all(*t);
    } else if (act.kind != policy::action_kind::resume) {
      const bool was_on = std::any_of(snap.models.begin(), snap.models.end(), [&](const auto& m) { return m.name == act.model && m.on_device; });
      auto st = apply_memory_action(*t->cfg.placement, act);
      if (st == memory::status::no_space &&
          (act.kind == policy::action_kind::stage || act.kind == policy::action_kind::load)) {
        // Weights come before cached prefixes: give the host tier back and try again.
        int dropped = 0;
        for (auto& m : models_)
          if (m->cache) dropped += m->cache->drop_host(m->cache->host_blocks());
        if (dropped > 0) st = apply_memory_action(*t->cfg.placement, act);
      }
      if (act.kind == policy::action_kind::load && !was_on) t->loaded_at = now;
      spdlog::debug("engine: {} {} ({}): {}", policy::action_name(act.kind), act.model, act.why, memory::status_name(st));
    }
  }
  if (plan.run.empty()) return nullptr;
  served* s = find(plan.run);
  return s && runnable(arb.snapshot(), s->cfg.name) ? s : nullptr;
}

void engine::preempt_all(served& s) {
  // One at a time off the running list, so that a copy that throws leaves every sequence in
  // exactly one list for the error path to end.
  while (!s.running.empty()) {
    auto a = s.running.back();
    preempt(s, *a);
    a->preempt = false;
    ++preemptions_;
    s.running.pop_back();
    s.preempted.push_front(std::move(a));
  }
  s.publish();
}

void engine::iterate(std::unique_lock<std::mutex>& lock) {
  // Take in what was submitted; drop what was cancelled, waiting or running.
  while (!submitted_.empty()) {
    auto a = std::move(submitted_.front());
    submitted_.pop_front();
    auto& t = *models_[a->model];
    t.arrival_rate = t.rate_at(a->arrived) + 1.0 / served::k_rate_window_s;
    t.last_arrival = a->arrived;
    t.waiting.push_back(std::move(a));
  }
  for (auto& s : models_) {
    for (auto it = s->waiting.begin(); it != s->waiting.end();) {
      if ((*it)->handle->cancel_requested()) {
        retire(*s, **it, finish_reason::cancelled);
        it = s->waiting.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = s->running.begin(); it != s->running.end();) {
      if ((*it)->handle->cancel_requested()) {
        retire(*s, **it, finish_reason::cancelled);
        it = s->running.erase(it);
      } else {
        ++it;
      }
    }
    for (auto it = s->preempted.begin(); it != s->preempted.end();) {
      if ((*it)->handle->cancel_requested()) {
        retire(*s, **it, finish_reason::cancelled);
        it = s->preempted.erase(it);
      } else {
        ++it;
      }
    }
  }
  served* s = config_.roster ? plan_and_pick() : pick();
  if (!s) {
    stalled_ = std::any_of(models_.begin(), models_.end(),
                           [](const auto& m) { return !m->waiting.empty() || !m->running.empty() || !m->preempted.empty(); });
    return;
  }
  s->last_pass = clock_type::now();
  // Preempted sequences come back first, oldest first, as blocks allow: swapped-out KV by copy,
  // the others to be evaluated again from their tokens.
  while (!s->preempted.empty()) {
    auto& a = s->preempted.front();
    // Only with headroom of a block per running sequence, or it would be the next victim.
    const int64_t bt = s->kv->block_tokens();
    const int32_t need = static_cast<int32_t>(
        a->recompute ? (std::min<int64_t>(static_cast<int64_t>(a->prompt.size()), config_.prefill_chunk) + bt - 1) / bt
                     : (s->ctx->pos(a->seq) + bt - 1) / bt);
    const int32_t want = need + static_cast<int32_t>(s->running.size());
    if (s->kv->free_blocks() < want && s->cache) s->cache->evict(want);
    if (s->kv->free_blocks() < want && !s->running.empty()) break;
    const bool back = a->recompute
                          ? s->kv->reserve(a->seq, std::min<int64_t>(static_cast<int64_t>(a->prompt.size()), config_.prefill_chunk)) == memory::status::ok
                          : s->kv->swap_in(a->seq) == memory::status::ok;
    if (!back) break;
    a->recompute = false;
    s->running.push_back(std::move(a));
    s->preempted.pop_front();
  }
  // Admit into free slots while the pool can hold each prompt's first chunk (not while
  // preempted sequences wait: they were first).
  while (s->preempted.empty() && !s->waiting.empty() && !s->free_seqs.empty()) {
    prefer_cached_prefix(*s);
    auto& a = s->waiting.front();
    const int64_t seq = s->free_seqs.back();
    // A cached prefix is adopted, not evaluated again.
    const std::vector<int32_t> cached = s->cache ? s->cache->match(a->prompt) : std::vector<int32_t>{};
    if (!cached.empty()) s->kv->adopt(seq, cached);
    const int64_t start = static_cast<int64_t>(cached.size()) * s->kv->block_tokens();
    const int64_t first = start + std::min<int64_t>(static_cast<int64_t>(a->prompt.size()) - start, config_.prefill_chunk);
    if (s->kv->reserve(seq, first) != memory::status::ok &&
        (!s->cache || (s->cache->evict(static_cast<int32_t>((first + s->kv->block_tokens() - 1) / s->kv->block_tokens()) -
                                       static_cast<int32_t>(s->kv->table(seq).size())),
                       s->kv->reserve(seq, first) != memory::status::ok))) {
      s->kv->drop(seq);
      break;
    }
    if (start > 0) {
      s->ctx->assume(start, seq);
      a->prefilled = start;
      prefix_reused_ += start;
    }
    s->free_seqs.pop_back();
    a->seq = seq;
    s->running.push_back(std::move(a));
    s->waiting.pop_front();
  }
  // The pass runs without the lock: submit() and cancel() stay responsive meanwhile.
  lock.unlock();
  try {
    const auto t0 = clock_type::now();
    step(*s);
    learn_pass_cost(*s, std::chrono::duration<double>(clock_type::now() - t0).count());
  } catch (const std::exception& e) {
    lock.lock();
    for (auto& a : s->running) retire(*s, *a, finish_reason::error, e.what());
    s->running.clear();
    return;
  }
  lock.lock();
  // Retire what finished in the pass; set aside what it preempted.
  for (auto it = s->running.begin(); it != s->running.end();) {
    if ((*it)->ending != finish_reason::none) {
      retire(*s, **it, (*it)->ending);
      it = s->running.erase(it);
    } else if ((*it)->preempt) {
      (*it)->preempt = false;
      ++preemptions_;
      s->preempted.push_back(std::move(*it));
      it = s->running.erase(it);
    } else {
      ++it;
    }
  }
  s->publish();
}

namespace {
constexpr int64_t k_decode_probe_every = 8;
constexpr size_t k_admission_lookahead = 8;  // waiting requests considered for a cached prefix
constexpr auto k_admission_patience = std::chrono::seconds(2);
}  // namespace

void engine::prefer_cached_prefix(served& s) {
  // When the pool cannot hold the next request's first chunk, a request a little further back
  // whose prompt starts with cached blocks goes first: it needs fewer new blocks, and its
  // cached ones would otherwise be the next to leave the device.
  if (!s.cache || s.waiting.size() < 2) return;
  const int64_t bt = s.kv->block_tokens();
  const auto& front = *s.waiting.front();
  // Not past a request that has waited long: a stream of requests sharing a prompt must not
  // starve one that shares nothing.
  if (clock_type::now() - front.arrived > k_admission_patience) return;
  const int64_t first = std::min<int64_t>(static_cast<int64_t>(front.prompt.size()), config_.prefill_chunk);
  if (s.kv->free_blocks() >= (first + bt - 1) / bt) return;  // not tight
  size_t best = 0;
  int32_t best_blocks = s.cache->peek(front.prompt);
  const size_t look = std::min<size_t>(s.waiting.size(), k_admission_lookahead);
  for (size_t i = 1; i < look; ++i) {
    const int32_t n = s.cache->peek(s.waiting[i]->prompt);
    if (n > best_blocks) {
      best = i;
      best_blocks = n;
    }
  }
  if (best == 0) return;
  auto chosen = std::move(s.waiting[best]);
  s.waiting.erase(s.waiting.begin() + static_cast<long>(best));
  s.waiting.push_front(std::move(chosen));
}

int64_t engine::prompt_row_limit(const served& s) const {
  if (config_.itl_budget <= 0) return std::numeric_limits<int64_t>::max();
  // Until both costs are known, a small probe chunk measures them.
  if (s.decode_pass_s <= 0 || s.prompt_row_s <= 0) return std::min<int64_t>(config_.prefill_chunk, 4);
  const double rows = (config_.itl_budget - 1.0) * s.decode_pass_s / s.prompt_row_s;
  // At least one row a pass: a prompt always advances, even when one row costs more than the budget.
  return std::max<int64_t>(1, static_cast<int64_t>(rows));
}

void engine::learn_pass_cost(served& s, double seconds) {
  // Moving averages: the costs drift as contexts grow (attention) and batches change.
  constexpr double k_weight = 0.25;
  auto blend = [](double old, double now) { return old <= 0 ? now : old + k_weight * (now - old); };
  if (s.pass_decode_rows > 0 && s.pass_prompt_rows == 0) {
    s.decode_pass_s = blend(s.decode_pass_s, seconds);
  } else if (s.pass_decode_rows > 0 && s.pass_prompt_rows > 0 && s.decode_pass_s > 0) {
    // A ratio of averages, not an average of ratios: a pass of one prompt row would otherwise
    // turn a millisecond of jitter into a millisecond per row, and shrink the next chunks.
    s.prompt_extra_s = blend(s.prompt_extra_s, seconds - s.decode_pass_s);
    s.prompt_rows_avg = blend(s.prompt_rows_avg, static_cast<double>(s.pass_prompt_rows));
    s.prompt_row_s = std::max(s.prompt_extra_s, 1e-6 * s.prompt_rows_avg) / s.prompt_rows_avg;
  }
}

void engine::preempt(served& s, active& a) {
  // Swapped to the host tier when the pool has one (the sequence resumes bit for bit);
  // otherwise its KV is dropped and its tokens (prompt and generated) are evaluated again.
  a.preempt = true;
  auto st = s.kv->swap_out(a.seq);
  if (st == memory::status::no_space && s.cache && s.cache->host_blocks() > 0) {
    // The host tier is full of cached prefixes: a running sequence comes first.
    s.cache->drop_host(static_cast<int32_t>(s.kv->table(a.seq).size()));
    st = s.kv->swap_out(a.seq);
  }
  if (st == memory::status::ok) return;
  s.kv->drop(a.seq);
  s.ctx->reset(a.seq);
  a.recompute = true;
  a.prompt = a.history;
  a.prefilled = 0;
}

void engine::step(served& s) {
  auto& toks = s.row_tokens;
  auto& seqs = s.row_seqs;
  toks.clear();
  seqs.clear();
  int64_t budget = std::min(config_.max_batch_tokens, s.ctx->max_batch());  // the context's scratch rows bound a pass
  std::vector<active*> in_pass;
  for (auto& ap : s.running) ap->rows = 0;
  // Blocks for `tokens` positions of a's sequence; when the pool is out of them, the sequence
  // admitted last that is not yet in this pass is preempted for them (or a itself).
  auto blocks_for = [&](active& a, int64_t tokens) {
    while (s.kv->reserve(a.seq, tokens) != memory::status::ok) {
      // Cached blocks go before anyone's running work does.
      const auto short_by = static_cast<int32_t>((tokens + s.kv->block_tokens() - 1) / s.kv->block_tokens()) -
                            static_cast<int32_t>(s.kv->table(a.seq).size());
      if (s.cache && s.cache->blocks() > 0 && s.cache->evict(short_by) > 0 && s.kv->free_blocks() >= short_by) continue;
      active* victim = nullptr;
      for (auto it = s.running.rbegin(); it != s.running.rend() && !victim; ++it)
        if (it->get() != &a && !(*it)->preempt && (*it)->rows == 0 && std::find(in_pass.begin(), in_pass.end(), it->get()) == in_pass.end())
          victim = it->get();
      if (!victim) victim = &a;
      preempt(s, *victim);
      if (victim == &a) return false;
    }
    return true;
  };
  // Decoding sequences first, one row each, so that no prompt chunk crowds them out of a
  // pass; then prompt chunks. While sequences decode, the prompt rows of a pass are held to
  // what fits the ITL budget (prompt_row_limit); with none decoding, a prompt takes whole chunks.
  int64_t prompt_budget = std::numeric_limits<int64_t>::max();
  bool decoding = false, prefilling = false;
  for (const auto& ap : s.running) {
    if (ap->preempt) continue;
    (ap->prefilled >= static_cast<int64_t>(ap->prompt.size()) ? decoding : prefilling) = true;
  }
  if (decoding && prefilling) {
    prompt_budget = prompt_row_limit(s);
    // Every few passes, decode rows alone: keeps the measured cost of a decode pass current
    // as the streams' contexts grow (the budget is relative to it).
    if (++s.passes_with_prompts % k_decode_probe_every == 0) prompt_budget = 0;
  }
  s.pass_prompt_rows = s.pass_decode_rows = 0;
  for (const bool prompts : {false, true})
    for (auto& ap : s.running) {
      active& a = *ap;
      if (budget == 0) break;
      if (a.preempt || a.rows > 0) continue;
      const auto plen = static_cast<int64_t>(a.prompt.size());
      if ((a.prefilled < plen) != prompts) continue;
      s.ctx->set_prompt_end(a.seq, config_.fast_attention ? std::numeric_limits<int64_t>::max() : 0);
      if (prompts) {
        if (prompt_budget <= 0) break;
        const int64_t chunk = std::min({config_.prefill_chunk, plen - a.prefilled, budget, prompt_budget});
        if (!blocks_for(a, a.prefilled + chunk)) continue;
        for (int64_t i = 0; i < chunk; ++i) {
          toks.push_back(a.prompt[static_cast<size_t>(a.prefilled + i)]);
          seqs.push_back(a.seq);
        }
        a.rows = chunk;
        prompt_budget -= chunk;
        s.pass_prompt_rows += chunk;
      } else {
        if (!blocks_for(a, s.ctx->pos(a.seq) + 1)) continue;
        toks.push_back(a.next);
        seqs.push_back(a.seq);
        a.rows = 1;
        ++s.pass_decode_rows;
      }
      budget -= a.rows;
      in_pass.push_back(&a);
    }
  if (in_pass.empty()) return;
  s.ctx->step(toks, seqs);
  const auto logits = s.ctx->all_logits_rows();
  const int64_t vocab = s.cfg.model->config().n_vocab;
  std::vector<float> row(static_cast<size_t>(vocab));
  for (size_t k = 0; k < in_pass.size(); ++k) {
    active& a = *in_pass[k];
    if (a.prefilled < static_cast<int64_t>(a.prompt.size())) {
      a.prefilled += a.rows;
      if (a.prefilled < static_cast<int64_t>(a.prompt.size())) continue;  // more of the prompt to go
    }
    if (a.params.max_tokens == 0) {
      a.ending = finish_reason::length;
      continue;
    }
    std::copy_n(logits.data() + static_cast<int64_t>(k) * vocab, vocab, row.begin());
    const int32_t id = a.smp.sample(row, a.history);
    if (a.params.stop_at_eog && s.cfg.tokenizer->is_eog(id)) {
      a.ending = finish_reason::eog;
      continue;
    }
    a.history.push_back(id);
    a.next = id;
    ++a.generated;
    auto released = a.text.push(id);
    a.handle->push(id, std::move(released.text));
    if (released.stopped) a.ending = finish_reason::stop;
    else if (a.generated >= a.params.max_tokens) a.ending = finish_reason::length;
    else if (s.ctx->pos(a.seq) + 1 > s.cfg.context) a.ending = finish_reason::context;
  }
}

}  // namespace tandem::runtime
