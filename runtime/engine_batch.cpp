// The engine's pass: its plan over plain counts (plan_batch), the plan carried out on the real
// KV pool, the forward pass, then sampling and streaming.
#include <algorithm>
#include <limits>

#include <spdlog/spdlog.h>

#include "runtime/log.h"
#include "runtime/engine.h"
#include "runtime/engine_state.h"

namespace tandem::runtime {

batch_plan engine::plan_pass(served& s) {
  auto& st = s.pass.state;
  st.running.clear();
  for (const auto& a : s.queues.running) {
    const auto& table = s.kv->table(a->seq);
    batch_sequence q;
    q.prompt_tokens = static_cast<int64_t>(a->prompt.size());
    q.prefilled = a->prefilled;
    q.pos = s.ctx->pos(a->seq);
    q.blocks_held = static_cast<int32_t>(table.size());
    q.blocks_owned = static_cast<int32_t>(std::count_if(table.begin(), table.end(), [&](int32_t b) { return s.kv->refcount(b) == 1; }));
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
  toks.clear();
  seqs.clear();
  for (const auto& e : plan.entries) {
    const active& a = *s.queues.running[e.seq];
    s.ctx->set_prompt_end(a.seq, config_.fast_attention && !a.params.exact ? std::numeric_limits<int64_t>::max() : 0);
    for (int64_t i = 0; i < e.rows; ++i) {
      toks.push_back(e.prompt ? a.prompt[static_cast<size_t>(e.first + i)] : a.next);
      seqs.push_back(a.seq);
    }
  }
  // The pass's yield points (between its layers): other models' passes may run there.
  s.ctx->begin(toks, seqs);
  while (!s.ctx->advance())
    if (s.interleave.allowed) interleave(s);
  return {s.ctx->all_logits_rows(), static_cast<size_t>(s.cfg.model->config().n_vocab)};
}

void engine::apply(served& s, const batch_plan& plan, const step_result& r) {
  auto& in_pass = s.pass.seqs;
  auto& picks = s.pass.picks;
  in_pass.clear();
  picks.clear();
  for (size_t k = 0; k < plan.entries.size(); ++k) {
    const batch_entry& e = plan.entries[k];
    active& a = *s.queues.running[e.seq];
    in_pass.push_back(&a);
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
  const size_t vocab = r.vocab;
  pool_.parallel_for(static_cast<int64_t>(picks.size()), 1, [&](int64_t b, int64_t e) {
    thread_local std::vector<float> row;
    row.resize(vocab);
    for (int64_t i = b; i < e; ++i) {
      auto& [k, id] = picks[static_cast<size_t>(i)];
      std::copy_n(r.logits.data() + k * vocab, vocab, row.begin());
      id = in_pass[k]->smp.sample(row, in_pass[k]->history);
    }
  });
  for (const auto& [k, id] : picks) {
    active& a = *in_pass[k];
    if (a.params.stop_at_eog && s.cfg.tokenizer->is_eog(id)) {
      a.ending = finish_reason::eog;
      continue;
    }
    a.history.push_back(id);
    a.next = id;
    ++a.generated;
    auto released = a.text.push(id);
    a.handle->push(id, std::move(released.text));
    if (released.stopped)
      a.ending = finish_reason::stop;
    else if (a.generated >= a.params.max_tokens)
      a.ending = finish_reason::length;
    else if (s.ctx->pos(a.seq) + 1 > s.cfg.context)
      a.ending = finish_reason::context;
  }
}

void engine::step(served& s) {
  batch_plan plan = plan_pass(s);
  if (plan.mixed) ++s.itl.passes_with_prompts;
  reserve_for(s, plan);
  s.pass.decode_rows = s.pass.prompt_rows = 0;
  if (plan.entries.empty()) return;
  for (const auto& e : plan.entries) (e.prompt ? s.pass.prompt_rows : s.pass.decode_rows) += e.rows;
  apply(s, plan, execute(s, plan));
}

}  // namespace tandem::runtime
