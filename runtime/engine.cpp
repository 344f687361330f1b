#include "runtime/engine.h"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include "runtime/admission_plan.h"
#include "runtime/engine_state.h"

#if defined(TANDEM_HAVE_CUDA)
#include "models/cuda/gpu_forward.h"
#endif

namespace tandem::runtime {

namespace {
// Passes a draft proposes for before its measured gain is published to the planner.
constexpr int64_t k_draft_samples = 32;
// Past this wait, no request further back in the queue is preferred over one (admission_plan.h).
constexpr auto k_admission_patience = std::chrono::seconds(2);
}  // namespace

engine::engine(std::vector<engine_model> models, const engine_config& config)
    : config_(config), pool_(config.threads > 0 ? config.threads : kernels::cpu::default_thread_count()) {
  if (config.roster) roster_ = *config.roster;
  config_.roster = nullptr;  // roster_ is the one read from here on
  if (config.max_batch_tokens < 1 || config.prefill_chunk < 1) throw std::invalid_argument("engine: max_batch_tokens and prefill_chunk must be >= 1");
  if (!(config.itl_budget >= 0) || !(config.itl_target.count() >= 0)) throw std::invalid_argument("engine: itl_budget and itl_target must be >= 0");
  itl_ = {config.itl_budget, config.itl_target.count()};
  for (auto& cfg : models) {
    if (!cfg.model || !cfg.tokenizer) throw std::invalid_argument("engine: model '" + cfg.name + "' has no model or tokenizer");
    if (cfg.context < 1 || cfg.max_sequences < 1)
      throw std::invalid_argument("engine: model '" + cfg.name + "' needs a context and max_sequences of at least 1");
    for (const auto& other : models_)
      if (cfg.kv_pool && other->cfg.kv_pool == cfg.kv_pool)
        throw std::invalid_argument("engine: models '" + other->cfg.name + "' and '" + cfg.name + "' share a KV pool; each needs its own");
    if (find(cfg.name)) throw std::invalid_argument("engine: model '" + cfg.name + "' is listed twice");
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
                                    " positions and " + std::to_string(cfg.kv_pool->block_bytes()) + " bytes; it needs " + std::to_string(bt) +
                                    " and " + std::to_string(block));
      // One sequence of the whole context must fit, or a preempted one could never come back.
      if (static_cast<int64_t>(cfg.kv_pool->total_blocks()) * bt < cfg.context)
        throw std::invalid_argument("engine: the KV pool of model '" + cfg.name + "' holds " + std::to_string(cfg.kv_pool->total_blocks() * bt) +
                                    " positions, less than one sequence's context of " + std::to_string(cfg.context));
      s->kv = cfg.kv_pool;
    } else {
      const auto blocks = static_cast<int32_t>(cfg.max_sequences * ((cfg.context + bt - 1) / bt));
      // Uninitialised: pages are committed as blocks are written. Huge pages, as a context's
      // own cache and the arbiter's regions (models/forward.cpp says why).
      s->kv_memory = memory::huge_buffer(static_cast<size_t>(blocks) * block);
      s->own_kv = std::make_unique<memory::kv_pool>(s->kv_memory.data(), blocks, bt, block);
      s->kv = s->own_kv.get();
    }
    models::context_params cp;
    cp.n_ctx = cfg.context;
    cp.kv = cfg.kv;
    cp.kv_rotate = cfg.kv_rotate;
    cp.n_seq = cfg.max_sequences;
    cp.max_batch = config.max_batch_tokens;
    cp.kv_pool = s->kv;
    cp.scratch = cfg.scratch;
    // Weights in GPU memory (an arbiter on the CUDA backend) are computed by the CUDA forward
    // pass; everything else by the CPU kernels, which read the device tier directly.
    const bool gpu = cfg.placement && !cfg.placement->arbiter().device_backend().device_host_addressable();
    if (gpu) {
#if defined(TANDEM_HAVE_CUDA)
      if (!cfg.kv_pool)
        throw std::invalid_argument("engine: model '" + cfg.name + "' runs on the CUDA backend and needs a KV pool in its arbiter's device tier");
      models::gpu_context_params gp;
      gp.n_ctx = cfg.context;
      gp.n_seq = cfg.max_sequences;
      gp.max_batch = config.max_batch_tokens;
      gp.kv = cfg.kv;
      gp.kv_rotate = cfg.kv_rotate;
      gp.kv_pool = s->kv;
      // Verifying passes give logits for a sequence's proposals too.
      gp.max_logit_rows = cfg.max_sequences * (1 + std::max<int64_t>(cfg.speculate.max_tokens, 1));
      // Its activations and GEMM scratch under the device budget, owned by the model.
      gp.scratch_arbiter = &cfg.placement->arbiter();
      gp.owner = cfg.name;
      s->ctx = std::make_unique<models::gpu_forward>(*cfg.model, gp, cfg.residency);
#else
      throw std::invalid_argument("engine: model '" + cfg.name +
                                  "' is placed in device memory the CPU kernels cannot read, and this build has no CUDA backend");
#endif
    } else {
      s->ctx = std::make_unique<models::forward_context>(*cfg.model, cp, &pool_, cfg.residency);
    }
    for (int64_t q = cfg.max_sequences - 1; q >= 0; --q) s->free_seqs.push_back(q);
    if (config.prefix_cache)
      s->cache = std::make_unique<prefix_cache>(*s->kv, config.prefix_host_blocks < 0 ? s->kv->total_blocks() : config.prefix_host_blocks);
    s->pass.row_tokens.reserve(static_cast<size_t>(config.max_batch_tokens));
    s->pass.row_seqs.reserve(static_cast<size_t>(config.max_batch_tokens));
    s->publish();  // the pool's floor shows before the first iteration
    models_.push_back(std::move(s));
  }
  for (auto& s : models_) attach_draft(*s);
  if (roster_) check_placeable();
  thread_ = std::thread([this] { run(); });
}

void engine::attach_draft(served& s) {
  const auto& cfg = s.cfg;
  s.vocab.target = cfg.tokenizer;
  if (cfg.speculate.method != spec_method::draft) return;
  const std::string who = "engine: model '" + cfg.name + "'";
  if (cfg.draft.empty()) throw std::invalid_argument(who + " speculates with a draft model but names none");
  served* d = find(cfg.draft);
  if (!d) throw std::invalid_argument(who + " names draft '" + cfg.draft + "', which this engine does not serve");
  if (d == &s) throw std::invalid_argument(who + " names itself as its draft");
  if (d->cfg.speculate.method == spec_method::draft)
    throw std::invalid_argument(who + ": its draft '" + cfg.draft + "' speculates with a draft of its own");
  if (!same_vocabulary(*cfg.tokenizer, *d->cfg.tokenizer)) {
    // Proposals then pass through text: each side must be able to spell what the other says.
    for (const served* x : {&s, d})
      if (!x->cfg.tokenizer->encodes_any_text())
        throw std::invalid_argument(who + ": its draft '" + cfg.draft + "' has another vocabulary, and the tokenizer of '" + x->cfg.name +
                                    "' cannot spell every text (no byte tokens)");
    s.vocab.draft = d->cfg.tokenizer;
  }
  s.draft = d;
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
    if (t < 0 || t >= vocab)
      throw std::invalid_argument("token id " + std::to_string(t) + " is outside the vocabulary (" + std::to_string(vocab) + ")");
  if (r.params.max_tokens < 0) throw std::invalid_argument("max_tokens must be >= 0");
  if (r.params.logprobs < -1 || r.params.logprobs > 20) throw std::invalid_argument("logprobs must be -1 (none) or 0..20");
  for (const auto& stop : r.params.stop)
    if (stop.empty()) throw std::invalid_argument("a stop string is empty");
  auto a = std::make_shared<active>(std::move(r), m, *cfg.tokenizer);  // the sampler validates its parameters
  if (a->params.constraint) {
    std::shared_ptr<const grammar_vocab> v;
    {
      std::lock_guard lock(models_[m]->grammar_m);
      if (!models_[m]->constraint_vocab) models_[m]->constraint_vocab = make_grammar_vocab(*cfg.tokenizer);
      v = models_[m]->constraint_vocab;
    }
    a->matcher.emplace(a->params.constraint, std::move(v));
  }
  auto h = a->handle;
  {
    std::lock_guard lock(m_);
    auto& s = *models_[m];
    if (cfg.max_queue > 0 && s.in_flight >= cfg.max_sequences + cfg.max_queue)
      throw queue_full("model '" + cfg.name + "' has " + std::to_string(s.in_flight - cfg.max_sequences) +
                       " requests waiting, its limit; retry later");
    ++s.in_flight;
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

engine::served* engine::find(const std::string& name) const {
  for (const auto& s : models_)
    if (s->cfg.name == name) return s.get();
  return nullptr;
}

const engine::served& engine::known(const std::string& name) const {
  if (const served* s = find(name)) return *s;
  throw std::invalid_argument("unknown model '" + name + "'");
}

int32_t engine::kv_blocks_cached(const std::string& model) const { return known(model).kv_cached.load(); }

int32_t engine::kv_blocks_cached_on_host(const std::string& model) const { return known(model).kv_cached_host.load(); }

int64_t engine::prefix_blocks_restored() const {
  int64_t n = 0;
  for (const auto& s : models_) n += s->restored.load();
  return n;
}

int32_t engine::kv_blocks_in_use(const std::string& model) const { return known(model).kv_in_use.load(); }

void engine::run() {
  std::unique_lock lock(m_);
  for (;;) {
    if (stalled_) {
      // Work waits on memory, not on a caller: look again shortly (copies land, timers run).
      cv_.wait_for(lock, std::chrono::milliseconds(2), [&] { return stop_ || !submitted_.empty(); });
      stalled_ = false;
    } else {
      auto ready = [&] {
        if (stop_ || !submitted_.empty() || !controls_.empty()) return true;
        return std::any_of(models_.begin(), models_.end(), [](const auto& s) { return !s->queues.idle(); });
      };
      // With a roster the plan also runs when idle: keep-alive expiry, prefetch, the home model.
      if (roster_)
        cv_.wait_for(lock, std::chrono::milliseconds(250), ready);
      else
        cv_.wait(lock, ready);
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
  for (auto& a : s.queues.running) retire(s, *a, why, error);
  for (auto& a : s.queues.preempted) retire(s, *a, why, error);
  for (auto& a : s.queues.waiting) retire(s, *a, why, error);
  s.queues.running.clear();
  s.queues.preempted.clear();
  s.queues.waiting.clear();
}

void engine::retire(served& s, active& a, finish_reason why, const std::string& error) {
  const bool completed = why == finish_reason::length || why == finish_reason::eog || why == finish_reason::stop || why == finish_reason::context;
  if (completed)
    if (auto rest = a.text.flush(); !rest.empty()) a.handle->push(-1, std::move(rest));
  if (s.draft) drop_mirror(s, a);
  // Its output, for later requests' n-gram lookups (what a client hung up on counts too: the
  // tokens were the model's).
  if (s.cfg.speculate.method == spec_method::ngram && s.cfg.speculate.ngram_cache && a.generated > 0 && why != finish_reason::error)
    s.recent.add(std::span<const int32_t>(a.history).last(std::min(a.history.size(), static_cast<size_t>(a.generated))));
  if (a.seq >= 0) {
    // A sequence that ran to its end, or was cancelled between passes (a client that hung
    // up, an infill cut off: the IDE's next keystroke starts with the same tokens), leaves its
    // full blocks for later prompts: its KV holds the tokens of positions 0 .. pos-1 (the
    // last sampled token was never evaluated). After an error its KV is not trusted.
    if (s.cache && (completed || why == finish_reason::cancelled) && !s.kv->swapped_out(a.seq))
      s.cache->insert(std::span<const int32_t>(a.history.data(), static_cast<size_t>(s.ctx->pos(a.seq))), s.kv->table(a.seq));
    s.kv->drop(a.seq);
    s.ctx->reset(a.seq);
    s.free_seqs.push_back(a.seq);
    a.seq = -1;
  }
  s.publish();
  // The caller learns of the end only once its KV is free (a drained engine holds none).
  a.handle->finish(why, error);
  --s.in_flight;
  --in_flight_;
  if (in_flight_ == 0) idle_cv_.notify_all();
}

engine::served* engine::pick() {
  served* best = nullptr;
  double best_p = 0;
  const auto now = clock_type::now();
  for (auto& s : models_) {
    if (s->queues.idle()) continue;
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

void engine::take_submissions() {
  while (!submitted_.empty()) {
    auto a = std::move(submitted_.front());
    submitted_.pop_front();
    auto& t = *models_[a->model];
    t.arrivals.add(a->arrived);
    t.queues.waiting.push_back(std::move(a));
  }
}

void engine::drop_cancelled(served& s) {
  auto sweep = [&](auto& list) {
    for (auto it = list.begin(); it != list.end();) {
      if ((*it)->handle->cancel_requested()) {
        retire(s, **it, finish_reason::cancelled);
        it = list.erase(it);
      } else {
        ++it;
      }
    }
  };
  sweep(s.queues.waiting);
  sweep(s.queues.running);
  sweep(s.queues.preempted);
}

void engine::iterate(std::unique_lock<std::mutex>& lock) {
  // Take in what was submitted; drop what was cancelled, waiting or running.
  take_submissions();
  for (auto& s : models_) drop_cancelled(*s);
  apply_controls();
  served* s = roster_ ? plan_and_pick() : pick();
  if (!s) {
    // (apply_controls may have set it already: an eviction to retry.)
    stalled_ = stalled_ || std::any_of(models_.begin(), models_.end(), [](const auto& m) { return !m->queues.idle(); });
    return;
  }
  admit(*s);
  run_pass(*s, lock, roster_.has_value());
}

void engine::admit(served& s) {
  s.last_pass = clock_type::now();
  auto& q = s.queues;
  // A draft's own requests come before its mirrors of other models' sequences.
  if (s.free_seqs.empty() && !q.waiting.empty()) drop_mirrors_in(s);
  if (q.preempted.empty() && (q.waiting.empty() || s.free_seqs.empty())) return;
  // The plan over counts (admission_plan.h); the pool and cache have the last word below.
  const int64_t bt = s.kv->block_tokens();
  auto first_chunk = [&](const active& a) { return std::min<int64_t>(static_cast<int64_t>(a.prompt.size()), config_.prefill_chunk); };
  admission_state st;
  for (const auto& a : q.preempted)
    st.preempted_blocks.push_back(static_cast<int32_t>(((a->recompute ? first_chunk(*a) : s.ctx->pos(a->seq)) + bt - 1) / bt));
  const auto now = clock_type::now();
  const size_t look = q.preempted.empty() ? std::min(q.waiting.size(), s.free_seqs.size() + k_admission_lookahead) : 0;
  for (size_t i = 0; i < look; ++i) {
    const active& a = *q.waiting[i];
    st.waiting.push_back({static_cast<int64_t>(a.prompt.size()), s.cache ? s.cache->peek(a.prompt) : 0, now - a.arrived > k_admission_patience});
  }
  st.running = static_cast<int>(q.running.size());
  st.free_slots = static_cast<int>(s.free_seqs.size());
  st.free_blocks = s.kv->free_blocks();
  st.cached_blocks = s.cache && s.cache->blocks() > 0 ? s.cache->evictable() : 0;
  st.block_tokens = bt;
  st.prefill_chunk = config_.prefill_chunk;
  const admission_plan plan = plan_admission(st);

  // Preempted sequences come back oldest first: swapped-out KV by copy, the others to be
  // evaluated again from their tokens.
  for (size_t i = 0; i < plan.resume; ++i) {
    auto& a = q.preempted.front();
    const int32_t want = st.preempted_blocks[i] + static_cast<int32_t>(q.running.size());
    if (s.kv->free_blocks() < want && s.cache) s.cache->evict(want);
    const bool back = a->recompute ? s.kv->reserve(a->seq, first_chunk(*a)) == memory::status::ok : s.kv->swap_in(a->seq) == memory::status::ok;
    if (!back) return;
    a->recompute = false;
    q.running.push_back(std::move(a));
    q.preempted.pop_front();
  }
  if (!q.preempted.empty()) return;
  // New sequences, in the plan's order, while the pool holds each prompt's first chunk.
  std::vector<active*> chosen;
  for (const size_t i : plan.admit) chosen.push_back(q.waiting[i].get());
  for (active* a : chosen) {
    const int64_t seq = s.free_seqs.back();
    // A cached prefix is adopted, not evaluated again.
    const std::vector<int32_t> cached = s.cache ? s.cache->match(a->prompt) : std::vector<int32_t>{};
    if (!cached.empty()) s.kv->adopt(seq, cached);
    const int64_t start = static_cast<int64_t>(cached.size()) * bt;
    const int64_t first = start + std::min<int64_t>(static_cast<int64_t>(a->prompt.size()) - start, config_.prefill_chunk);
    if (s.kv->reserve(seq, first) != memory::status::ok &&
        (!s.cache || (s.cache->evict(static_cast<int32_t>((first + bt - 1) / bt) - static_cast<int32_t>(s.kv->table(seq).size())),
                      s.kv->reserve(seq, first) != memory::status::ok))) {
      s.kv->drop(seq);
      break;
    }
    if (start > 0) {
      s.ctx->assume(start, seq);
      a->prefilled = start;
      prefix_reused_ += start;
    }
    ++s.prefix_queries;
    if (start > 0) ++s.prefix_hits;
    s.free_seqs.pop_back();
    a->seq = seq;
  }
  // Admitted requests move from waiting to running, in the order they were admitted.
  for (active* a : chosen) {
    if (a->seq < 0) break;
    const auto it = std::find_if(q.waiting.begin(), q.waiting.end(), [&](const auto& w) { return w.get() == a; });
    q.running.push_back(std::move(*it));
    q.waiting.erase(it);
  }
}

void engine::run_pass(served& s, std::unique_lock<std::mutex>& lock, bool interleaving) {
  // At its yield points, passes of a higher-priority model may run (execute, engine_interleave.cpp).
  s.interleave.start_pass(interleaving);
  // The pass runs without the lock: submit() and cancel() stay responsive meanwhile.
  lock.unlock();
  try {
    const auto t0 = clock_type::now();
    const int64_t draft_ns = s.draft_ns.load();
    step(s);
    const double secs = std::chrono::duration<double>(clock_type::now() - t0).count() - s.interleave.seconds;
    s.itl.learn(s.pass.decode_rows, s.pass.prompt_rows, secs);
    const double in_draft = static_cast<double>(s.draft_ns.load() - draft_ns) / 1e9;
    if (s.draft && s.pass.decode_rows > 0 && s.pass.prompt_rows == 0 && secs > in_draft) {
      const double own = secs - in_draft;
      s.target_pass_s = s.target_pass_s <= 0 ? own : 0.9 * s.target_pass_s + 0.1 * own;
    }
    if (s.pass.drafted_seqs > 0 && secs > 0) {
      // The draft's gain (model_stats::draft_speedup): the planner keeps a draft that pays.
      const double sample =
          static_cast<double>(s.pass.drafted_tokens) / static_cast<double>(s.pass.drafted_seqs) * std::max(0.0, secs - in_draft) / secs;
      s.draft_gain_avg = s.draft_samples++ == 0 ? sample : 0.9 * s.draft_gain_avg + 0.1 * sample;
      // Published once the average has seen enough passes to judge (the first carry the
      // draft's catch-up with whole prompts).
      if (s.draft_samples >= k_draft_samples) s.draft_gain = s.draft_gain_avg;
    }
  } catch (const std::exception& e) {
    lock.lock();
    for (auto& a : s.queues.running) retire(s, *a, finish_reason::error, e.what());
    s.queues.running.clear();
    return;
  }
  lock.lock();
  // Retire what finished in the pass; set aside what it preempted.
  for (auto it = s.queues.running.begin(); it != s.queues.running.end();) {
    if ((*it)->ending != finish_reason::none) {
      retire(s, **it, (*it)->ending);
      it = s.queues.running.erase(it);
    } else if ((*it)->preempt) {
      (*it)->preempt = false;
      ++preemptions_;
      ++s.preemptions;
      s.queues.preempted.push_back(std::move(*it));
      it = s.queues.running.erase(it);
    } else {
      ++it;
    }
  }
  s.publish();
}

void engine::preempt(served& s, active& a) {
  // Swapped to the host tier when the pool has one (the sequence resumes bit for bit);
  // otherwise its KV is dropped and its tokens (prompt and generated) are evaluated again.
  a.preempt = true;
  if (s.draft) drop_mirror(s, a);  // the draft catches up again once it resumes
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

}  // namespace tandem::runtime
