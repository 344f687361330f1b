// Internal to the engine's translation units (engine.cpp, engine_placement.cpp,
// engine_batch.cpp): the state of one request and of one served model.
#pragma once

#include <atomic>
#include <chrono>
#include <cmath>
#include <deque>
#include <memory>
#include <optional>
#include <vector>

#include "memory/huge_buffer.h"
#include "runtime/engine.h"

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
  memory::huge_buffer kv_memory;  // when the engine makes the pool
  std::unique_ptr<memory::kv_pool> own_kv;
  memory::kv_pool* kv = nullptr;
  std::unique_ptr<models::forward_pass> ctx;  // forward_context, or gpu_forward on a CUDA backend
  std::deque<std::shared_ptr<active>> waiting;
  std::vector<std::shared_ptr<active>> running;  // in admission order
  std::deque<std::shared_ptr<active>> preempted;  // out of KV: swapped to host, or to recompute
  std::vector<int64_t> free_seqs;
  std::vector<int32_t> row_tokens;
  std::vector<int64_t> row_seqs;
  std::vector<active*> in_pass;    // sequences of the pass being formed (kept: no allocation per pass)
  std::vector<std::pair<size_t, int32_t>> picks;  // per sampled row: its place in the pass, the token
  std::atomic<int32_t> kv_in_use{0};  // published after each iteration: the pool itself is the engine thread's
  std::atomic<int32_t> kv_cached{0};
  std::atomic<int32_t> kv_cached_host{0};
  std::atomic<int64_t> restored{0};
  std::unique_ptr<prefix_cache> cache;
  clock_type::time_point last_pass = clock_type::now();
  clock_type::time_point loaded_at{};  // when the engine last started loading it (placement by plan)
  int in_flight = 0;  // submitted and not finished (engine::m_): the queue limit
  // For model_stats (engine::m_).
  int64_t prefix_queries = 0, prefix_hits = 0, preemptions = 0;
  int64_t swap_ins = 0, swap_outs = 0;
  uint64_t swap_in_bytes = 0, swap_out_bytes = 0;
  double swap_in_seconds = 0, last_swap_in_seconds = 0;
  std::optional<clock_type::time_point> swap_in_started;  // a swap-in whose segments are still landing
  // The ITL budget's estimates (engine_config::itl_budget): seconds of a pass of decode rows
  // only, and of one prompt row beside them; 0 until measured. Rows of the pass being run.
  double decode_pass_s = 0, prompt_row_s = 0;
  double prompt_extra_s = 0, prompt_rows_avg = 0;  // averages prompt_row_s is the ratio of
  int64_t pass_prompt_rows = 0, pass_decode_rows = 0;
  int64_t passes_with_prompts = 0;
  // Interleaving during this model's pass: when other models' passes first ran between its
  // layers, and their seconds (not counted in this pass's learned cost).
  std::optional<clock_type::time_point> paused_since;
  double interleaved_s = 0;
  bool interleave_failed = false;  // an interleaved admission threw: none more in this pass
  int64_t interleaved_passes = 0;  // passes of this model run inside another's (engine::m_)
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

}  // namespace tandem::runtime
