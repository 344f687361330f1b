// The engine's pass: its plan over plain counts (plan_batch), the plan carried out on the real
// KV pool, the forward pass, then sampling and streaming.
#include <algorithm>
#include <limits>

#include <spdlog/spdlog.h>

#include "runtime/log.h"
#include "runtime/engine.h"
#include "runtime/engine_state.h"

namespace tandem::runtime {

namespace {

// n-gram lengths of the lookups: a single token matches too often to be worth a row.
constexpr int k_ngram_min = 2, k_ngram_max = 4;
constexpr int64_t k_draft_probe_every = 16;  // passes without guesses before one is tried (draft_length)
constexpr int64_t k_draft_trial_every = 8;   // sequences between two that try a draft afresh

}  // namespace

int64_t engine::draft_length(served& s, active& a, int64_t room) {
  spec_window& w = a.window;
  // The sequence's own record once it has a few guesses judged; before, the model's, except
  // that every so many sequences try afresh (the text they bring may suit the draft better).
  const bool own = w.record.judged >= 3;
  if (!own && w.trial < 0) w.trial = s.draft_trials++ % k_draft_trial_every == 0 ? 1 : 0;
  const double acceptance = own ? w.record.rate() : w.trial == 1 ? -1.0 : s.draft_record.rate();
  if (!config_.spec_cost_aware || acceptance < 0 || s.draft_pass_s <= 0 || s.target_pass_s <= 0) return room;  // (nothing measured yet)
  if (const int64_t k = best_draft_length(acceptance, s.draft_pass_s / s.target_pass_s, room); k > 0) {
    w.probe_gap = 0;
    return k;
  }
  // Nothing pays now. A sequence the draft follows guesses once now and then, so its record
  // follows the text, less often each time that still does not pay (each costs the draft a
  // catch-up); one it does not follow stays without (catching up would cost its whole history).
  if (a.mirror.seq < 0) return 0;
  if (++w.passes_idle < std::max(w.probe_gap, k_draft_probe_every)) return 0;
  w.probe_gap = std::max(w.probe_gap, k_draft_probe_every / 2) * 2;
  return 1;
}

void engine::propose(served& s, active& a, int decoding) {
  a.draft.clear();
  a.draft_room = 0;
  a.drafted = false;
  const spec_settings& cfg = s.cfg.speculate;
  const bool predicted = !a.params.prediction.empty();
  if (!a.params.speculate || a.matcher || (cfg.method == spec_method::off && !predicted)) return;
  if (a.prefilled < static_cast<int64_t>(a.prompt.size()) || decoding > config_.spec_max_batch) return;
  const int64_t most = std::max<int64_t>(cfg.max_tokens, 1);
  const int64_t pos = s.ctx->pos(a.seq);
  // Room: every accepted token and the one after them must be wanted (max_tokens) and fit
  // the context, so a pass never computes rows the request could not keep.
  const int64_t room = std::min({a.window.next(most), a.params.max_tokens - a.generated - 1, s.cfg.context - pos - 1});
  if (room <= 0) return;
  if (predicted) {
    // The answer so far (its first token came from the prompt's pass) looked up in the
    // prediction, single tokens included: the prediction is text the answer is expected to
    // follow, not a corpus that repeats by chance.
    const auto& pred = a.params.prediction;
    const std::span<const int32_t> out(a.history.data() + (a.history.size() - static_cast<size_t>(a.generated)), static_cast<size_t>(a.generated));
    const int64_t at = lookup_proposals(pred, out, 1, k_ngram_max, a.prediction_at, room, a.draft);
    if (at >= 0) {
      a.prediction_at = at;
      return;
    }
  }
  if (cfg.method == spec_method::ngram) {
    if (lookup_proposals(a.history, a.history, k_ngram_min, k_ngram_max, std::numeric_limits<int64_t>::max(), room, a.draft) < 0 && cfg.ngram_cache)
      s.recent.lookup(a.history, k_ngram_min, k_ngram_max, room, a.draft);
  } else if (cfg.method == spec_method::draft && s.draft)
    a.draft_room = draft_length(s, a, room);  // draft_round guesses for it, with the other sequences
}

batch_plan engine::plan_pass(served& s) {
  auto& st = s.pass.state;
  st.running.clear();
  int decoding = 0;
  for (const auto& a : s.queues.running) decoding += a->prefilled >= static_cast<int64_t>(a->prompt.size());
  for (const auto& a : s.queues.running) propose(s, *a, decoding);
  if (s.draft) draft_round(s);
  for (const auto& a : s.queues.running) {
    const auto& table = s.kv->table(a->seq);
    batch_sequence q;
    q.prompt_tokens = static_cast<int64_t>(a->prompt.size());
    q.prefilled = a->prefilled;
    q.pos = s.ctx->pos(a->seq);
    q.blocks_held = static_cast<int32_t>(table.size());
    q.blocks_owned = static_cast<int32_t>(std::count_if(table.begin(), table.end(), [&](int32_t b) { return s.kv->refcount(b) == 1; }));
    q.draft = static_cast<int64_t>(a->draft.size());
    st.running.push_back(q);
  }
  st.max_rows = std::min(config_.max_batch_tokens, s.ctx->max_batch());  // the context's scratch rows bound a pass
  st.prefill_chunk = config_.prefill_chunk;
  st.block_tokens = s.kv->block_tokens();
  st.free_blocks = s.kv->free_blocks();
  st.cached_blocks = s.cache && s.cache->blocks() > 0 ? s.cache->evictable() : 0;
  st.prompt_row_limit = s.itl.prompt_row_limit(itl_, config_.prefill_chunk);
  st.probe_due = s.itl.probe_next();
  st.swap_in = s.swaps.in_started.has_value();
  return plan_batch(st);
}

void engine::reserve_for(served& s, batch_plan& plan) {
  if (plan.drop_cached > 0 && s.cache) s.cache->evict(s.kv->free_blocks() + plan.drop_cached);
  for (const size_t i : plan.preempt) preempt(s, *s.queues.running[i]);
  // The plan's counts are the pool's, so every reservation fits; should one not (a count the
  // plan could not see), that sequence gives way this pass rather than the pass failing.
  size_t kept = 0;
  for (size_t k = 0; k < plan.entries.size(); ++k) {
    active& a = *s.queues.running[plan.entries[k].seq];
    if (s.kv->reserve(a.seq, plan.reserve_tokens[k]) != memory::status::ok) {
      runtime::logger().debug("engine: {}: {} KV positions did not fit as planned; preempting it", s.cfg.name, plan.reserve_tokens[k]);
      preempt(s, a);
      continue;
    }
    plan.entries[kept] = plan.entries[k];
    plan.reserve_tokens[kept++] = plan.reserve_tokens[k];
  }
  plan.entries.resize(kept);
  plan.reserve_tokens.resize(kept);
}

step_result engine::execute(served& s, const batch_plan& plan) {
  auto& toks = s.pass.row_tokens;
  auto& seqs = s.pass.row_seqs;
  auto& logit_rows = s.pass.logit_rows;
  toks.clear();
  seqs.clear();
  logit_rows.clear();
  bool verifying = false;
  for (const auto& e : plan.entries) {
    const active& a = *s.queues.running[e.seq];
    s.ctx->set_prompt_end(a.seq, config_.fast_attention && !a.params.exact ? std::numeric_limits<int64_t>::max() : 0);
    // A decode entry: the last token, then its proposals (each row's logits verify the next).
    for (int64_t i = 0; i < e.rows; ++i) {
      toks.push_back(e.prompt ? a.prompt[static_cast<size_t>(e.first + i)] : i == 0 ? a.next : a.draft[static_cast<size_t>(i - 1)]);
      seqs.push_back(a.seq);
    }
    logit_rows.push_back(1 + e.draft);
    verifying = verifying || e.draft > 0;
  }
  // The pass's yield points (between its layers): other models' passes may run there.
  s.ctx->begin(toks, seqs, verifying ? std::span<const int64_t>(logit_rows) : std::span<const int64_t>());
  while (!s.ctx->advance())
    if (s.interleave.allowed) interleave(s);
  return {s.ctx->all_logits_rows(), static_cast<size_t>(s.cfg.model->config().n_vocab)};
}

void engine::apply(served& s, const batch_plan& plan, const step_result& r) {
  auto& in_pass = s.pass.seqs;
  auto& picks = s.pass.picks;
  auto& at = s.pass.logits_at;
  in_pass.clear();
  picks.clear();
  at.clear();
  int64_t row = 0;
  for (size_t k = 0; k < plan.entries.size(); ++k) {
    const batch_entry& e = plan.entries[k];
    active& a = *s.queues.running[e.seq];
    in_pass.push_back(&a);
    at.push_back(row);
    row += 1 + e.draft;
    if (e.prompt) {
      a.prefilled += e.rows;
      if (a.prefilled < static_cast<int64_t>(a.prompt.size())) continue;  // more of the prompt to go
    }
    if (a.params.max_tokens == 0) {
      a.ending = finish_reason::length;
      continue;
    }
    picks.push_back({k, -1});
  }
  // Each sequence samples from a copy of its row (the sampler edits it: penalties), on the
  // pool: sampling without top-k walks the whole vocabulary, and 16 streams of that one after
  // another would leave the other cores idle for milliseconds a pass. One copy per thread.
  // A verifying entry samples its rows in turn while each draw equals the proposal that row
  // checks (speculation.h): the draw of row i is made with the tokens before it in the
  // history, as it would be without speculation.
  const size_t vocab = r.vocab;
  auto& drawn = s.pass.drawn;
  auto& drawn_lp = s.pass.drawn_logprobs;
  if (drawn.size() < picks.size()) drawn.resize(picks.size());
  if (drawn_lp.size() < picks.size()) drawn_lp.resize(picks.size());
  pool_.parallel_for(static_cast<int64_t>(picks.size()), 1, [&](int64_t b, int64_t e) {
    thread_local std::vector<float> logits;
    logits.resize(vocab);
    for (int64_t i = b; i < e; ++i) {
      const size_t k = picks[static_cast<size_t>(i)].first;
      active& a = *in_pass[k];
      auto& got = drawn[static_cast<size_t>(i)];
      auto& got_lp = drawn_lp[static_cast<size_t>(i)];
      got.clear();
      got_lp.clear();
      const int64_t draft = plan.entries[k].draft;
      for (int64_t j = 0; j <= draft; ++j) {
        const float* row_logits = r.logits.data() + (at[k] + j) * static_cast<int64_t>(vocab);
        std::copy_n(row_logits, vocab, logits.begin());
        if (a.matcher && !a.matcher->mask(logits)) {
          got.push_back(-1);  // the grammar cannot go on in this vocabulary: the generation ends
          break;
        }
        got.push_back(a.smp.sample(logits, a.history));
        if (a.params.logprobs >= 0) got_lp.push_back(log_probabilities({row_logits, vocab}, got.back(), a.params.logprobs));
        if (j == draft || got.back() != a.draft[static_cast<size_t>(j)]) break;
        a.history.push_back(got.back());  // for the next row's penalties; taken back below
      }
      a.history.resize(a.history.size() - (got.size() - 1));
    }
  });
  for (size_t i = 0; i < picks.size(); ++i) {
    const size_t k = picks[i].first;
    active& a = *in_pass[k];
    const int64_t draft = plan.entries[k].draft;
    const int64_t pos = s.ctx->pos(a.seq) - 1 - draft;  // the decode row's position (before this pass)
    int64_t used = 0;                                   // rows whose tokens this pass keeps
    for (const int32_t id : drawn[i]) {
      ++used;
      if (id < 0) {
        runtime::logger().warn("engine: {}: no token of the vocabulary continues the request's grammar here; ending it", s.cfg.name);
        a.ending = finish_reason::stop;
        break;
      }
      if ((a.params.stop_at_eog || a.matcher) && s.cfg.tokenizer->is_eog(id)) {
        a.ending = finish_reason::eog;
        break;
      }
      if (a.matcher) a.matcher->accept(id);  // (the mask allowed it)
      a.history.push_back(id);
      a.next = id;
      ++a.generated;
      auto released = a.text.push(id);
      std::optional<token_logprob> lp;
      if (a.params.logprobs >= 0 && static_cast<size_t>(used - 1) < drawn_lp[i].size()) lp = std::move(drawn_lp[i][static_cast<size_t>(used - 1)]);
      a.handle->push(id, std::move(released.text), std::move(lp));
      if (released.stopped || (a.matcher && a.matcher->finished()))
        a.ending = finish_reason::stop;
      else if (a.generated >= a.params.max_tokens)
        a.ending = finish_reason::length;
      else if (pos + used + 1 > s.cfg.context)
        a.ending = finish_reason::context;
      if (a.ending != finish_reason::none) break;
    }
    if (draft == 0) {
      sync_mirror(s, a);  // (the draft guessed, but the plan had no rows for them)
      continue;
    }
    // Positions past the rows kept held rejected (or unneeded) proposals: forgotten, and their
    // blocks back to the pool. The KV now covers the history but its last token.
    const int64_t accepted = static_cast<int64_t>(drawn[i].size()) - 1;
    s.ctx->truncate(pos + used, a.seq);
    s.kv->truncate(a.seq, pos + used);
    sync_mirror(s, a);
    a.window.learn(draft, accepted, std::max<int64_t>(s.cfg.speculate.max_tokens, 1));
    if (a.drafted) s.draft_record.add(draft, accepted);
    a.handle->add_speculation(draft, accepted);
    s.spec_proposed += draft;
    s.spec_accepted += accepted;
    ++s.spec_passes;
    s.spec_tokens += used;
    if (a.drafted) {
      ++s.pass.drafted_seqs;
      s.pass.drafted_tokens += used;
    }
  }
}

void engine::step(served& s) {
  // Its context is in use until the pass ends: no draft round may borrow it meanwhile.
  struct in_flight {
    bool& flag;
    explicit in_flight(bool& f) : flag(f) { flag = true; }
    ~in_flight() { flag = false; }
  } guard(s.stepping);
  batch_plan plan = plan_pass(s);
  if (plan.mixed) ++s.itl.passes_with_prompts;
  reserve_for(s, plan);
  s.pass.decode_rows = s.pass.prompt_rows = 0;
  s.pass.drafted_seqs = s.pass.drafted_tokens = 0;
  if (plan.entries.empty()) return;
  // A proposal's row costs what a prompt row does: the ITL estimator learns it as one.
  for (const auto& e : plan.entries) {
    (e.prompt ? s.pass.prompt_rows : s.pass.decode_rows) += e.rows - e.draft;
    s.pass.prompt_rows += e.draft;
  }
  apply(s, plan, execute(s, plan));
}

}  // namespace tandem::runtime
