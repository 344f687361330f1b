// The engine: one thread that owns the forward passes of the models it serves and steps them
// with continuous batching. submit() is thread-safe and returns a handle that streams token
// ids and can cancel. Each iteration: take in submitted requests (per-model queues), drop
// cancelled ones (their KV is freed at once), pick the model with the highest effective
// priority that has work (priority, plus aging for waiting requests), admit waiting requests
// into free sequence slots while the KV pool has room, and run one pass: a chunk of each
// prefilling prompt and one token of every decoding sequence, up to max_batch_tokens rows.
// Then sample per request (its own seed and parameters), stream, and retire what finished.
// When the KV pool runs out of blocks, the sequence admitted last is preempted: swapped to the
// host tier when the pool has an arbiter (it resumes bit for bit), else its tokens are
// evaluated again later; preempted sequences resume before new ones are admitted. Finished
// sequences leave their full KV blocks in a per-model prefix cache (prefix_cache.h); a new
// prompt that starts with cached blocks adopts them and skips evaluating those tokens, and
// cached blocks are released, least recently used first, before anything is preempted.
//
// Memory placement: with a roster in the config, every iteration asks the planner
// (policy/planner.h) for a plan over the arbiter's snapshot and the queues, carries out its
// memory actions (stage, load, evict; preempt swaps a model's running sequences to host) and
// steps the model the plan names, once its segments are on the device or streamable. Without
// one, every model's weights must already be readable (owned, or resident in an arbiter), and
// the model to step is picked by priority with aging.
//
// Interleaving (with a roster, policy.interleave): while a model's pass runs, requests for a
// model of higher priority whose weights are all on the device do not wait for the pass to
// end. At a yield point of its pass (forward_pass::advance, between two layers) the engine
// runs that model's passes until it has no work left (or the paused pass has waited
// policy.max_wait), then the paused pass goes on. A long
// prompt of a big model, or its pass streaming weights through the link, delays a code
// completion by one layer, not by the whole pass.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "configs/roster.h"
#include "memory/kv_pool.h"
#include "models/arbiter_residency.h"
#include "models/forward.h"
#include "models/model.h"
#include "models/tokenizer.h"
#include "models/weight_residency.h"
#include "runtime/memory_plan.h"
#include "policy/plan_types.h"
#include "runtime/batch_plan.h"
#include "runtime/grammar.h"
#include "runtime/itl_estimator.h"
#include "runtime/prefix_cache.h"
#include "runtime/request_handle.h"
#include "runtime/sampler.h"
#include "runtime/speculation.h"
#include "runtime/text_stream.h"

namespace tandem::runtime {

struct engine_model {
  std::string name;
  const models::model* model = nullptr;
  const models::tokenizer* tokenizer = nullptr;  // end-of-generation tokens
  int priority = 0;
  int max_sequences = 4;
  int64_t context = 2048;  // positions per sequence
  kernels::cpu::kv_type kv = kernels::cpu::kv_type::f16;
  models::weight_residency* residency = nullptr;  // null: the model's own weights
  memory::kv_pool* kv_pool = nullptr;             // null: the engine makes one in RAM for every slot
  // With engine_config::roster: the model's segments in the arbiter, registered under `name`;
  // the engine moves them by the plan (and reads weights through them when residency is null).
  models::arbiter_residency* placement = nullptr;
  // Requests that may wait beyond the max_sequences running ones; submit() refuses more with
  // queue_full. 0: no limit.
  int max_queue = 0;
  // CPU backend: the activation scratch the caller placed (e.g. in an arbiter's device tier),
  // at least forward_context::scratch_bytes for max_sequences and max_batch_tokens; null: the
  // context allocates its own.
  std::byte* scratch = nullptr;
  bool kv_rotate = false;  // models::context_params::kv_rotate
  // Tokens proposed for verification beside each decode row (speculation.h); a request's
  // generation_params::prediction proposes whatever this says.
  spec_settings speculate = {};
  // With speculate.method draft: the engine model (another entry of the same engine) whose
  // greedy guesses are verified. Its tokenizer may differ: proposals then pass through text
  // (draft_mirror.h). Its sequence slots not used by its own requests mirror this model's
  // decoding sequences; while its weights are off the device, nothing is proposed.
  std::string draft = {};
};

// submit() on a model whose queue is full (engine_model::max_queue): the caller should retry
// later (HTTP 429).
struct queue_full : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// An operator's change to a served model (admin routes, Ollama's keep_alive), applied by the
// engine thread before its next plan; needs a roster. Unset fields stay as they are.
struct model_control {
  std::optional<int> priority{};
  std::optional<bool> pinned{};
  std::optional<configs::keep_alive_setting> keep_alive{};
  bool load = false;   // bring the weights to the device now (the keep-alive clock restarts)
  bool evict = false;  // take them off the device now: running sequences are swapped out and
                       // resume when the plan brings the model back for its waiting work
};

// One model as the engine sees it, for the admin routes and /metrics.
struct model_stats {
  int queued = 0, running = 0, preempted = 0;
  int32_t kv_blocks_used = 0, kv_blocks_total = 0, kv_blocks_cached = 0, kv_blocks_cached_host = 0;
  // The elastic pool's pages (one KV block each): held on the device now, its floor, its
  // bytes of the device tier each, and blocks copied to the host and back so far.
  int32_t kv_blocks_device = 0, kv_blocks_floor = 0;
  uint64_t kv_block_bytes = 0;
  int64_t kv_blocks_moved_to_host = 0, kv_blocks_moved_to_device = 0;
  int priority = 0;
  bool pinned = false;
  configs::keep_alive_setting keep_alive;
  std::chrono::steady_clock::time_point last_used{};  // last pass (or load)
  int64_t prefix_queries = 0, prefix_hits = 0;        // admissions, and those that adopted cached blocks
  int64_t preemptions = 0;
  int64_t interleaved_passes = 0;  // its passes run between the layers of another model's pass
  // Weights brought to the device (swap-ins) and taken off it (swap-outs) by the plan or an
  // operator; a swap-in's seconds run from its start until every segment is resident.
  int64_t swap_ins = 0, swap_outs = 0;
  uint64_t swap_in_bytes = 0, swap_out_bytes = 0;
  double swap_in_seconds = 0, last_swap_in_seconds = 0;
  // Speculation: tokens proposed and accepted, and the passes that verified proposals with
  // the tokens those gave (accepted ones and the one sampled where the guess parted).
  int64_t spec_proposed = 0, spec_accepted = 0, spec_passes = 0, spec_tokens = 0;
  double draft_seconds = 0;  // spent in the draft model's passes for its proposals
  std::string draft;         // its draft model ("" without one)
  // The draft's measured gain: tokens per sequence and pass of the passes it proposed for,
  // scaled by the share of their time not spent in the draft (a verifying pass taken to cost
  // what a plain one does, as it does while decode is bound by reading weights); 0 until it
  // has proposed for enough passes to judge.
  double draft_speedup = 0;
};

struct engine_config {
  int threads = 0;                 // 0: all cores
  int64_t max_batch_tokens = 256;  // rows of one pass
  int64_t prefill_chunk = 128;     // prompt tokens of one sequence per pass
  // While sequences are decoding, the rows of a pass with prompt rows are held to a time
  // budget of max(itl_target, itl_budget x a pass of decode rows alone): the engine measures
  // both costs as it runs and fills each pass with prompt rows up to the budget (one prompt
  // row a pass always goes in). The target keeps a long prompt moving beside cheap decode
  // passes; the ratio bounds the streams' slowdown where a decode pass alone already takes the
  // target. A prompt of at most prefill_chunk tokens goes in whole regardless. Both 0: prompt
  // chunks of prefill_chunk whatever they cost (itl_estimator.h).
  double itl_budget = 2.0;
  std::chrono::duration<double> itl_target = std::chrono::milliseconds(50);
  double aging_per_s = 10;   // priority a waiting request gains per second of waiting
  bool prefix_cache = true;  // keep finished sequences' full KV blocks for later prompts
  // Most prefix-cache blocks kept on the host tier once they leave the device (when the
  // model's KV pool has an arbiter with a host tier); 0: dropped instead; below 0: as many
  // as the model's KV pool has blocks. Host copies give way whenever the host tier is needed
  // for a sequence's swap-out or a model's weights.
  int32_t prefix_host_blocks = -1;
  // Attention by the tiled f32 kernel and SwiGLU by a vector e^x (forward_context::
  // set_prompt_end) for every row, prompt and generated: each key read once per tile of rows,
  // several times faster than llama.cpp's f16 arithmetic at long contexts, and within float
  // noise of it. Off: prompts and tokens are computed as llama.cpp computes them (and as
  // `tandem run` does).
  bool fast_attention = true;
  // The policy and the models' priorities, keep-alive and pins: with it, the planner places
  // the models (each needs a placement in one arbiter and a roster entry of its name). The
  // engine keeps a copy, which model_control changes.
  const configs::roster* roster = nullptr;
  double link_gb_s = 0;  // host -> device speed for the planner's reload costs; 0: the backend's throttle, else 25
  // No proposals while more sequences than this decode: a pass of that many rows is no longer
  // bound by reading the weights, so verifying guesses would cost what they save.
  int spec_max_batch = 16;
  // A draft model guesses only as many tokens as pay at the sequence's acceptance and the
  // draft's measured cost (engine::draft_length); off: always as many as the window allows.
  bool spec_cost_aware = true;
};

struct generation_params {
  int64_t max_tokens = 128;
  sampling_params sampling;
  bool stop_at_eog = true;
  // The generation ends where one of these first appears in its text, which then stops before
  // it; text that may still begin one is held back until it cannot (text_stream.h).
  std::vector<std::string> stop;
  // This request's rows computed as llama.cpp computes them (f16 attention, expf, ggml's
  // Q4_1/Q5_1 order) whatever engine_config::fast_attention says: `tandem run`'s default,
  // whose output is llama.cpp's to the token. Other rows of the same pass keep theirs.
  bool exact = false;
  // Speculation as the model's settings say (engine_model::speculate); false: none for this request.
  bool speculate = true;
  // Tokens the output is expected mostly to repeat (OpenAI's predicted outputs): proposed by
  // n-gram lookup in them, whatever the model's method, unless speculate is false.
  std::vector<int32_t> prediction;
  // -1: none; 0..20: each generated token's log-probability comes with its piece, with this
  // many of the most likely tokens' (log_probabilities: from the raw logits).
  int logprobs = -1;
  // Constrained decoding: each token is drawn from those the grammar allows next, and the
  // generation ends (finish_reason::stop) once the text is a whole sentence that nothing may
  // follow, or at an end-of-generation token where the grammar may end. No speculation.
  std::shared_ptr<const runtime::grammar> constraint;
};

struct engine_request {
  std::string model;
  std::vector<int32_t> prompt;
  generation_params params;
};

class engine {
 public:
  // Throws std::invalid_argument for a model entry without a model or tokenizer, a duplicate
  // name, and (with a roster) a model without a placement or roster entry, or one that could
  // not run even with the device to itself (its weights, or with policy.stream its stream
  // slots, beside every model's KV pool and the scratch).
  engine(std::vector<engine_model> models, const engine_config& config);
  ~engine();  // cancels what is still running and joins the thread
  engine(const engine&) = delete;
  engine& operator=(const engine&) = delete;

  // Throws std::invalid_argument (before queueing anything) for an unknown model, an empty
  // prompt, a prompt that does not fit the model's context, sampling parameters out of range,
  // logprobs outside -1..20, or an empty stop string.
  std::shared_ptr<request_handle> submit(engine_request r);
  // Waits until every submitted request has finished.
  void drain();
  // KV blocks in use by a model as of the last iteration (0 once it is idle): for tests and
  // metrics.
  int32_t kv_blocks_in_use(const std::string& model) const;
  // Sequences preempted so far because the KV pool ran out of blocks.
  int64_t preemptions() const;
  // Prompt tokens served from the prefix cache instead of being evaluated, so far.
  int64_t prefix_tokens_reused() const;
  // KV blocks a model's prefix cache holds on the device (not counted in kv_blocks_in_use),
  // and copies of its blocks waiting on the host tier.
  int32_t kv_blocks_cached(const std::string& model) const;
  int32_t kv_blocks_cached_on_host(const std::string& model) const;
  // Prefix-cache blocks copied back from the host for a hit, so far.
  int64_t prefix_blocks_restored() const;
  // Throws std::invalid_argument for an unknown model, and (control) without a roster.
  void control(const std::string& model, const model_control& c);
  model_stats stats(const std::string& model) const;

 private:
  struct active;
  struct pass_buffers;
  struct served;
  void run();
  void iterate(std::unique_lock<std::mutex>& lock);
  // The parts of an iteration (engine::m_ held): queue what was submitted; retire a model's
  // cancelled requests; bring back its preempted sequences and admit waiting ones; run its
  // pass (the lock released meanwhile) and retire what finished. With `interleaving`, passes
  // of higher-priority models may run between the pass's layers.
  void take_submissions();
  void drop_cancelled(served& s);
  void admit(served& s);
  void run_pass(served& s, std::unique_lock<std::mutex>& lock, bool interleaving);
  // At a yield point of `outer`'s pass, between two layers (execute; engine thread,
  // engine::m_ not held): passes of the model interleavable() names, until it has none left
  // (engine_interleave.cpp).
  void interleave(served& outer) noexcept;
  served* interleavable(const served& outer, std::chrono::steady_clock::duration paused);
  // Device KV bytes a model's waiting work needs and its pool cannot get now (the planner
  // makes room for them); 0 when the free pages suffice.
  uint64_t kv_wanted(const served& s) const;
  // Ends, with an error naming the sizes, each preempted sequence whose KV could not fit on the
  // device even with every other model evicted (snap and facts in models_ order).
  void end_unplaceable(const policy::snapshot& snap, std::span<const model_facts> facts);
  served* find(const std::string& name) const;         // null when no model has that name
  const served& known(const std::string& name) const;  // throws std::invalid_argument for an unknown name
  served* pick();
  served* plan_and_pick();
  void preempt_all(served& s);
  // One pass of `s` (engine_batch.cpp): plan it over plain counts (batch_plan.h), carry out its
  // evictions, preemptions and reservations on the real pool, run the forward pass, then
  // sample and stream. Sequences that finish or were preempted are marked for run_pass.
  void step(served& s);
  batch_plan plan_pass(served& s);
  // The tokens `a` proposes for the next pass (active::draft), with `decoding` sequences of
  // the model decoding: none while it prefills, speculation is off, or the batch is large.
  void propose(served& s, active& a, int decoding);
  // A draft model's proposals for the sequences `propose` left to it (engine_draft.cpp): the
  // draft catches up with each history, then guesses greedily, one row per sequence a pass.
  void draft_round(served& s);
  // Guesses to ask of the draft for `a`, at most `room`: the number that pays at the
  // sequence's acceptance (the model's before it has its own) and the draft's measured cost
  // (best_draft_length); 0 when none does, except for a probe of one every so many passes.
  int64_t draft_length(served& s, active& a, int64_t room);
  bool draft_ready(const served& s) const;
  // Resolves engine_model::draft (constructor); throws std::invalid_argument naming the models.
  void attach_draft(served& s);
  // After the target's pass: the mirror keeps what agrees with the history, its KV the same.
  void sync_mirror(served& s, active& a);
  void drop_mirror(served& s, active& a);  // frees its slot and KV in the draft
  void drop_mirrors_in(served& draft);     // every target sequence's mirror in `draft`
  void reserve_for(served& s, batch_plan& plan);
  step_result execute(served& s, const batch_plan& plan);
  void apply(served& s, const batch_plan& plan, const step_result& r);
  void check_placeable() const;
  void apply_controls();
  memory::status carry_out(served& t, const policy::action& act, const memory::arbiter_snapshot& snap);
  void finish_swap_ins();
  void retire(served& s, active& a, finish_reason why, const std::string& error = {});
  void preempt(served& s, active& a);
  void end_all(served& s, finish_reason why, const std::string& error);

  engine_config config_;
  itl_limits itl_;                         // from config_: the per-pass budget beside decoding streams
  std::optional<configs::roster> roster_;  // the engine's own copy: operators change it (control)
  kernels::cpu::thread_pool pool_;
  std::vector<std::unique_ptr<served>> models_;
  mutable std::mutex m_;
  std::condition_variable cv_, idle_cv_;
  std::deque<std::shared_ptr<active>> submitted_;
  std::deque<std::pair<std::string, model_control>> controls_;
  int in_flight_ = 0;  // submitted and not yet finished
  std::atomic<int64_t> preemptions_{0};
  std::atomic<int64_t> prefix_reused_{0};
  bool stop_ = false;
  bool stalled_ = false;  // work waits on memory (copies landing, a plan's timers): poll, do not spin
  std::thread thread_;
};

}  // namespace tandem::runtime
