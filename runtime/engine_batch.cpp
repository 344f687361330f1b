// The engine's batch: which rows go into a pass (decode rows, then prompt chunks under the
// ITL budget), the pass itself, sampling and streaming, and admission's preference for
// cached prefixes.
#include <algorithm>
#include <limits>

#include "runtime/engine.h"
#include "runtime/engine_state.h"

namespace tandem::runtime {

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

void engine::step(served& s) {
  auto& toks = s.row_tokens;
  auto& seqs = s.row_seqs;
  toks.clear();
  seqs.clear();
  int64_t budget = std::min(config_.max_batch_tokens, s.ctx->max_batch());  // the context's scratch rows bound a pass
  auto& in_pass = s.in_pass;
  in_pass.clear();
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
  // A short prompt (one chunk at most) goes in whole whatever the budget: the budget keeps a
  // long prefill from stalling the streams, but holding a burst of short requests to a row or
  // two a pass would keep them waiting for hundreds of passes (and out of the batch) to spare
  // the streams a few milliseconds once.
  int64_t prompt_budget = std::numeric_limits<int64_t>::max();
  bool decoding = false, prefilling = false;
  for (const auto& ap : s.running) {
    if (ap->preempt) continue;
    (ap->prefilled >= static_cast<int64_t>(ap->prompt.size()) ? decoding : prefilling) = true;
  }
  bool probe = false;
  if (decoding && prefilling) {
    prompt_budget = prompt_row_limit(s);
    // Every few passes, decode rows alone: keeps the measured cost of a decode pass current
    // as the streams' contexts grow (the budget is relative to it).
    probe = ++s.passes_with_prompts % k_decode_probe_every == 0;
    if (probe) prompt_budget = 0;
  }
  // While the model's weights are still landing (a swap-in), the copy sets the pace of the
  // pass, not its rows: a prompt takes as many rows as the pass holds, not one chunk.
  const int64_t chunk_cap = s.swap_in_started ? budget : config_.prefill_chunk;
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
        const bool short_prompt = !probe && plen <= config_.prefill_chunk && plen - a.prefilled <= budget;
        if (prompt_budget <= 0 && !short_prompt) continue;
        const int64_t chunk = short_prompt ? plen - a.prefilled : std::min({chunk_cap, plen - a.prefilled, budget, prompt_budget});
        if (!blocks_for(a, a.prefilled + chunk)) continue;
        for (int64_t i = 0; i < chunk; ++i) {
          toks.push_back(a.prompt[static_cast<size_t>(a.prefilled + i)]);
          seqs.push_back(a.seq);
        }
        a.rows = chunk;
        if (!short_prompt) prompt_budget -= chunk;
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
  const auto vocab = static_cast<size_t>(s.cfg.model->config().n_vocab);
  auto& picks = s.picks;
  picks.clear();
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
    picks.push_back({k, -1});
  }
  // Each sequence samples from a copy of its row (the sampler edits it: penalties), on the
  // pool: sampling without top-k walks the whole vocabulary, and 16 streams of that one after
  // another would leave the other cores idle for milliseconds a pass. One copy per thread.
  pool_.parallel_for(static_cast<int64_t>(picks.size()), 1, [&](int64_t b, int64_t e) {
    thread_local std::vector<float> row;
    row.resize(vocab);
    for (int64_t i = b; i < e; ++i) {
      auto& [k, id] = picks[static_cast<size_t>(i)];
      std::copy_n(logits.data() + k * vocab, vocab, row.begin());
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
    if (released.stopped) a.ending = finish_reason::stop;
    else if (a.generated >= a.params.max_tokens) a.ending = finish_reason::length;
    else if (s.ctx->pos(a.seq) + 1 > s.cfg.context) a.ending = finish_reason::context;
  }
}

}  // namespace tandem::runtime
