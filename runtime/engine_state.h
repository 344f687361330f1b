// Internal to the engine's translation units (engine.cpp, engine_batch.cpp,
// engine_placement.cpp, engine_interleave.cpp): the state of one request and of one served
// model, composed of small plain parts (queues, ITL estimator, swap and interleave state).
#pragma once

#include <atomic>
#include <chrono>
#include <cmath>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "memory/huge_buffer.h"
#include "runtime/batch_plan.h"
#include "runtime/draft_mirror.h"
#include "runtime/grammar_matcher.h"
#include "runtime/engine.h"
#include "runtime/interleave_state.h"
#include "runtime/itl_estimator.h"
#include "runtime/request_queues.h"
#include "runtime/swap_stats.h"

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
  int32_t next = -1;                           // the last generated token, fed in the next pass
  finish_reason ending = finish_reason::none;  // set by the pass; retired right after it
  bool preempt = false;                        // preempted by the pass being formed: set aside after it
  bool recompute = false;                      // preempted without a host copy: its tokens are evaluated again
  std::vector<int32_t> draft;                  // tokens proposed for the pass being formed (speculation)
  spec_window window;                          // how many to propose next
  int64_t prediction_at = 0;                   // where in params.prediction the last proposals came from
  int64_t draft_room = 0;                      // proposals left to the draft model this pass (0: none)
  draft_mirror mirror;                         // its state in the draft model
  bool drafted = false;                        // active::draft came from the draft model this pass
  std::optional<grammar_matcher> matcher;      // with generation_params::constraint

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

// The pass being formed and run, kept between passes so that none allocates.
struct engine::pass_buffers {
  std::vector<int32_t> row_tokens;
  std::vector<int64_t> row_seqs;
  std::vector<active*> seqs;                               // per plan entry: its sequence
  std::vector<std::pair<size_t, int32_t>> picks;           // per sampled row: its plan entry, the token
  std::vector<int64_t> logit_rows;                         // per plan entry: rows of logits (1 + its draft)
  std::vector<int64_t> logits_at;                          // per plan entry: its first row of logits
  std::vector<std::vector<int32_t>> drawn;                 // per sampled entry: the tokens its rows gave
  std::vector<std::vector<token_logprob>> drawn_logprobs;  // and their log-probabilities, when asked for
  batch_state state;                                       // plan_batch's input (its vectors kept)
  int64_t decode_rows = 0, prompt_rows = 0;                // of the pass run last: what the ITL estimator learns from
  int64_t drafted_seqs = 0, drafted_tokens = 0;            // of the pass run last: sequences the draft proposed for, their tokens
};

// Requests per second, decaying over a minute: how likely a model is to be wanted next.
struct arrival_rate {
  double rate = 0;
  clock_type::time_point last{};
  static constexpr double k_window_s = 60;
  double at(clock_type::time_point t) const { return rate * std::exp(-std::chrono::duration<double>(t - last).count() / k_window_s); }
  void add(clock_type::time_point t) {
    rate = at(t) + 1.0 / k_window_s;
    last = t;
  }
};

struct engine::served {
  engine_model cfg;
  memory::huge_buffer kv_memory;  // when the engine makes the pool
  std::unique_ptr<memory::kv_pool> own_kv;
  memory::kv_pool* kv = nullptr;
  std::unique_ptr<models::forward_pass> ctx;  // forward_context, or gpu_forward on a CUDA backend
  std::unique_ptr<prefix_cache> cache;
  ngram_cache recent;  // finished outputs, for n-gram lookup across requests (spec_settings::ngram_cache)
  request_queues<std::shared_ptr<active>> queues;
  std::vector<int64_t> free_seqs;  // sequence slots no request holds
  pass_buffers pass;
  itl_estimator itl;  // the ITL budget's costs (engine_config::itl_budget, itl_target)
  swap_stats swaps;
  interleave_state interleave;
  arrival_rate arrivals;  // the planner's prefetch hint
  // Published after each iteration for kv_blocks_in_use and friends: the pool itself is the
  // engine thread's.
  std::atomic<int32_t> kv_in_use{0};
  std::atomic<int32_t> kv_cached{0};
  std::atomic<int32_t> kv_cached_host{0};
  std::atomic<int32_t> kv_device{0};  // blocks the pool holds on the device (kv_pool::device_blocks)
  std::atomic<int64_t> kv_moved_to_host{0}, kv_moved_to_device{0};
  std::atomic<int64_t> restored{0};
  std::atomic<int64_t> spec_proposed{0}, spec_accepted{0}, spec_passes{0}, spec_tokens{0};
  std::atomic<int64_t> draft_ns{0};  // in the draft's passes for this model's proposals
  // Moving averages for the draft's length (engine::draft_length): seconds of one draft pass
  // (a catch-up or guessing step of its rounds), and of this model's own decode passes with
  // the draft's time taken out.
  double draft_pass_s = 0, target_pass_s = 0;
  acceptance_record draft_record;     // the draft's guesses over every sequence: a new one's prior
  int64_t draft_trials = 0;           // sequences that asked for the record (every k_draft_trial_every-th tries afresh)
  served* draft = nullptr;            // engine_model::draft, resolved
  draft_vocab vocab;                  // target and (another vocabulary) draft tokenizers
  bool stepping = false;              // its pass is in flight: its context is not free for drafting
  std::atomic<double> draft_gain{0};  // model_stats::draft_speedup: draft_gain_avg once judged
  double draft_gain_avg = 0;          // a moving average over the passes the draft proposed for
  int64_t draft_samples = 0;
  clock_type::time_point last_pass = clock_type::now();
  clock_type::time_point loaded_at{};  // when the engine last started loading it (placement by plan)
  int in_flight = 0;                   // submitted and not finished (engine::m_): the queue limit
  // Its vocabulary as grammars see it, made for the first request with a grammar (submit).
  std::mutex grammar_m;
  std::shared_ptr<const runtime::grammar_vocab> constraint_vocab;
  // For model_stats (engine::m_).
  int64_t prefix_queries = 0, prefix_hits = 0, preemptions = 0;
  void publish() {
    const int32_t cached = cache ? cache->blocks() : 0;
    kv_cached = cached;
    kv_cached_host = cache ? cache->host_blocks() : 0;
    restored = cache ? cache->restored() : 0;
    kv_in_use = kv->held_blocks() - cached;
    kv_device = kv->device_blocks();
    kv_moved_to_host = kv->moved_to_host();
    kv_moved_to_device = kv->moved_to_device();
  }
};

}  // namespace tandem::runtime
