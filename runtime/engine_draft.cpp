// Speculation by a draft model: the draft's passes that propose for a target's decoding
// sequences, and the mirrors (draft_mirror.h) that keep its KV in step with their histories.
// The draft's rows run between the target's passes on the engine thread, in the draft's own
// context and KV pool; a draft whose weights are off the device proposes nothing.
#include <algorithm>
#include <limits>

#include <spdlog/spdlog.h>

#include "runtime/engine.h"
#include "runtime/engine_state.h"
#include "runtime/log.h"
#include "runtime/memory_plan.h"

namespace tandem::runtime {

namespace {

int32_t argmax(std::span<const float> row) { return static_cast<int32_t>(std::max_element(row.begin(), row.end()) - row.begin()); }

}  // namespace

bool engine::draft_ready(const served& s) const {
  const served* d = s.draft;
  if (!d || d->stepping) return false;  // (its own pass paused for an interleaved one)
  if (!roster_ || !d->cfg.placement) return true;
  return all_resident(d->cfg.placement->arbiter().snapshot(), d->cfg.name);
}

void engine::drop_mirror(served& s, active& a) {
  draft_mirror& m = a.mirror;
  if (m.seq >= 0 && s.draft) {
    served& d = *s.draft;
    d.kv->drop(m.seq);
    d.ctx->reset(m.seq);
    d.free_seqs.push_back(m.seq);
  }
  m = draft_mirror{};
}

void engine::drop_mirrors_in(served& draft) {
  for (auto& t : models_) {
    if (t->draft != &draft) continue;
    for (auto& a : t->queues.running) drop_mirror(*t, *a);
    for (auto& a : t->queues.preempted) drop_mirror(*t, *a);
  }
  draft.publish();
}

void engine::sync_mirror(served& s, active& a) {
  draft_mirror& m = a.mirror;
  if (m.seq < 0 || !s.draft) return;
  resync(m, s.vocab, a.history);
  served& d = *s.draft;
  const auto kept = static_cast<int64_t>(m.fed.size());
  if (d.ctx->pos(m.seq) > kept) {
    d.ctx->truncate(kept, m.seq);
    d.kv->truncate(m.seq, kept);
  }
}

void engine::draft_round(served& s) {
  std::vector<active*> want;
  for (auto& a : s.queues.running)
    if (a->draft_room > 0) want.push_back(a.get());
  if (want.empty()) return;
  if (!draft_ready(s)) {
    for (active* a : want) a->draft_room = 0;
    return;
  }
  served& d = *s.draft;
  const auto t0 = clock_type::now();
  d.last_pass = t0;  // in use: its keep-alive and idle clocks run from here
  // One lane per sequence: what it feeds this round, and its guesses (draft vocabulary).
  struct lane {
    active* a;
    std::vector<int32_t> feed, guesses;
    int64_t guesses_wanted = 0;
  };
  std::vector<lane> lanes;
  std::vector<int32_t> toks;
  std::vector<int64_t> seqs;
  const int64_t max_rows = std::min(config_.max_batch_tokens, d.ctx->max_batch());
  const int64_t vocab = d.cfg.model->config().n_vocab;
  int64_t steps = 0;  // draft passes run
  try {
    int64_t rows = 0;
    for (active* a : want) {
      draft_mirror& m = a->mirror;
      if (rows >= max_rows) break;
      if (m.seq < 0) {
        // Only slots the draft's own requests do not wait for.
        if (d.free_seqs.empty() || !d.queues.waiting.empty()) continue;
        m.seq = d.free_seqs.back();
        d.free_seqs.pop_back();
        d.ctx->set_prompt_end(m.seq, config_.fast_attention ? std::numeric_limits<int64_t>::max() : 0);
        start_mirror(m, s.vocab);
      }
      lane l{a, {}, {}, 0};
      const bool level = catch_up(m, s.vocab, a->history, std::min(config_.prefill_chunk, max_rows - rows), l.feed);
      const auto fed = static_cast<int64_t>(m.fed.size());
      if (d.ctx->pos(m.seq) > fed) {  // (catch_up gave back a token to feed again)
        d.ctx->truncate(fed, m.seq);
        d.kv->truncate(m.seq, fed);
      }
      if (l.feed.empty()) continue;
      const auto end = fed + static_cast<int64_t>(l.feed.size());
      if (end >= d.cfg.context) {  // the history has outgrown the draft's context
        drop_mirror(s, *a);
        continue;
      }
      // Another vocabulary: one guess more, as the retokenized proposal loses its last token.
      if (level) l.guesses_wanted = std::min(a->draft_room + (s.vocab.draft ? 1 : 0), d.cfg.context - end);
      if (d.kv->reserve(m.seq, end + std::max<int64_t>(l.guesses_wanted - 1, 0)) != memory::status::ok) {
        drop_mirror(s, *a);
        a->draft_room = 0;
        continue;
      }
      toks.insert(toks.end(), l.feed.begin(), l.feed.end());
      seqs.insert(seqs.end(), l.feed.size(), m.seq);
      rows += static_cast<int64_t>(l.feed.size());
      lanes.push_back(std::move(l));
    }
    // The catch-up rows (logits for each lane's last one), then one row per lane still
    // guessing, until each has its guesses; lanes still catching up only feed.
    std::vector<lane*> going;
    auto take_guesses = [&] {
      const auto logits = d.ctx->all_logits_rows();
      std::vector<lane*> next;
      for (size_t i = 0; i < going.size(); ++i) {
        lane& l = *going[i];
        if (l.guesses_wanted == 0) continue;
        const int32_t g = argmax(logits.subspan(i * static_cast<size_t>(vocab), static_cast<size_t>(vocab)));
        const bool eog = d.cfg.tokenizer->is_eog(g);
        if (!(eog && s.vocab.draft)) l.guesses.push_back(g);  // an end spells no text
        if (!eog && static_cast<int64_t>(l.guesses.size()) < l.guesses_wanted) next.push_back(&l);
      }
      going = std::move(next);
    };
    if (!lanes.empty()) {
      ++steps;
      d.ctx->step(toks, seqs);
      for (auto& l : lanes) {
        commit_fed(l.a->mirror, s.vocab, l.feed);
        going.push_back(&l);
      }
      take_guesses();
    }
    while (!going.empty()) {
      toks.clear();
      seqs.clear();
      for (lane* l : going) {
        toks.push_back(l->guesses.back());
        seqs.push_back(l->a->mirror.seq);
        l->a->mirror.fed.push_back(l->guesses.back());  // fed, not agreed: resync decides
      }
      ++steps;
      d.ctx->step(toks, seqs);
      take_guesses();
    }
    for (auto& l : lanes)
      if (l.guesses_wanted > 0) {
        to_target(s.vocab, l.guesses, l.a->draft_room, l.a->draft);
        l.a->drafted = !l.a->draft.empty();
      }
  } catch (const std::exception& e) {
    // The target goes on without proposals; the draft's sequences start over next time.
    runtime::logger().warn("engine: draft '{}' for '{}' failed: {}; its proposals stop for now", d.cfg.name, s.cfg.name, e.what());
    for (active* a : want) {
      a->draft.clear();
      drop_mirror(s, *a);
    }
  }
  for (active* a : want) a->draft_room = 0;
  const auto spent = clock_type::now() - t0;
  s.draft_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(spent).count();
  if (steps > 0) {
    const double per = std::chrono::duration<double>(spent).count() / static_cast<double>(steps);
    s.draft_pass_s = s.draft_pass_s <= 0 ? per : 0.9 * s.draft_pass_s + 0.1 * per;
  }
}

}  // namespace tandem::runtime
