// Execution state of a few sequences on a Llama-family model: KV cache, scratch, and the
// forward pass (llama, qwen2, qwen3 differ only in data-driven details: biases, q/k norms,
// RoPE pairing). Several sequences decode together in one pass so every weight is read once
// for all of them (batched decode); the executor's paged KV cache replaces the fixed per-
// sequence slots used here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_pool.h"
#include "memory/huge_buffer.h"
#include "memory/kv_pool.h"
#include "models/forward_pass.h"
#include "models/model.h"
#include "models/weight_residency.h"

namespace tandem::models {

// Context size used when none is asked for: the training context, at most this (as
// llama.cpp, whose default n_ctx is 4096), so a file declaring a huge training context does
// not size a huge cache by default.
inline constexpr int64_t k_default_context = 4096;

// RoPE as the model's config and rope_freqs ask for it (freq_factors points into w).
kernels::cpu::rope_params rope_params_of(const model_config& c, const model_weights& w);

// Bytes of K and V cache for n_ctx positions of every layer.
uint64_t kv_cache_bytes(const model_config& c, int64_t n_ctx, kernels::cpu::kv_type kv);

struct context_params {
  int64_t n_ctx = 0;                                      // 0: min(training context, k_default_context)
  kernels::cpu::kv_type kv = kernels::cpu::kv_type::f16;  // llama.cpp's default cache type
  // Keys and values rotated per head by a Hadamard transform before they are stored, queries
  // rotated alike and the attention output rotated back (kernels::cpu::hadamard_heads): for
  // quantized caches, whose blocks a single outlier would otherwise scale. Needs head_dim a
  // power of two. default_kv_rotate gives the usual choice.
  bool kv_rotate = false;
  int64_t max_batch = 512;  // prompt tokens per forward pass (scratch rows,
                            // at most n_ctx; below 1 means 1)
  int64_t n_seq = 1;        // independent sequences, each with n_ctx
                            // positions of KV cache (1 .. k_max_sequences)
  // A paged KV cache (memory/kv_pool.h) instead of the context's own: sequence s of the
  // context is the pool's sequence s, and its positions live in the blocks the caller has
  // reserved for it (eval and decode refuse tokens beyond them). Block size: block_tokens *
  // kv_bytes_per_token(). The pool must outlive the context.
  memory::kv_pool* kv_pool = nullptr;
  // Activation scratch the caller provides (at least forward_context::scratch_bytes, 64-byte
  // aligned), e.g. an arbiter's device-tier allocation owned as scratch; null: the context
  // allocates its own. Must outlive the context.
  std::byte* scratch = nullptr;
  // On: a decode step (one row, or a batch of up to k_team_max_rows rows of one arithmetic) on
  // a pool of several threads runs each layer as one team job
  // (thread_pool::run_team: every product and attention in fixed parts, a barrier between
  // steps) instead of a pool job per step, each split and balanced by parallel_for. The
  // logits are the same bits either way. On by default: where the two cores of a 2-core Zen 4
  // sit on different dies, decode gains 4-20%; on one die it moves -5% to +4% (Zen 2, 3 and 4;
  // docs/cpu-kernels.md, "One team job per layer"). `tandem bench --compare-layer-teams`
  // measures the two where the cores sit.
  bool layer_teams = true;
};

// Bytes one position takes in a paged KV block: K and V of every layer.
uint64_t kv_bytes_per_token(const model_config& c, kernels::cpu::kv_type kv);

// Whether a cache of type kv is rotated unless asked otherwise: q4_0, whose 16 levels a
// block's one outlier leaves to the rest far too coarse; not q8_0, which loses little without.
inline bool default_kv_rotate(kernels::cpu::kv_type kv) { return kv == kernels::cpu::kv_type::q4_0; }

// Why model c cannot keep a cache of type kv (rotated or not), or empty: quantized types need
// head_dim a multiple of 32, rotation a power of two.
std::string kv_type_problem(const model_config& c, kernels::cpu::kv_type kv, bool rotate);

// Most sequences one context holds (decode() takes at most this many rows per pass).
inline constexpr int64_t k_max_sequences = 256;
// The most rows a forward pass runs as layer teams (context_params::layer_teams): decode steps
// of one sequence or a batch of up to this many; longer passes (prompts) keep a balanced pool
// job per step. Teams gained 1-2% over jobs for batches of 8 and lost 1% at 16 (2-core Xeon).
inline constexpr int64_t k_team_max_rows = 8;

// Owns the KV cache and scratch of n_seq sequences, sized once at construction; eval() and
// decode() allocate nothing, except that eval(..., all_logits = true) grows the logits buffer
// to one row per token. The model must outlive the context. The constructor throws
// std::invalid_argument for a context size outside [1, k_max_context] or n_seq outside
// [1, k_max_sequences], and std::runtime_error when memory_bytes() is more than the process
// can get (memory::usable_memory_bytes).
class forward_context final : public forward_pass {
 public:
  // residency: where the weights are read from. Null: the model's own (load_options::
  // own_weights); otherwise the segments it leases, one at a time, prefetching the next ones
  // (the model may have been loaded with own_weights off or on, the plan is the same). A pass
  // holds one segment at a time, so one stream slot is enough for a model that is not
  // resident; eval and decode throw std::logic_error when a segment cannot be had at all
  // (no slot reserved: arbiter_residency::prepare_streaming was not called).
  forward_context(const model& m, const context_params& p, kernels::cpu::thread_pool* pool, weight_residency* residency = nullptr);
  ~forward_context() override;
  forward_context(const forward_context&) = delete;
  forward_context& operator=(const forward_context&) = delete;

  // Bytes a context with these parameters allocates at construction: KV cache (n_seq slots),
  // scratch (rows = max(min(max_batch, n_ctx), n_seq) of every activation) and n_seq rows of
  // logits. Throws std::invalid_argument for a context size outside [1, k_max_context] or
  // n_seq outside [1, k_max_sequences].
  static uint64_t memory_bytes(const model_config& c, const context_params& p);
  // The activation scratch alone (context_params::scratch).
  static uint64_t scratch_bytes(const model_config& c, const context_params& p);

  // Runs `tokens` at positions pos() .. pos()+n-1 (in chunks of max_batch) and appends them to
  // the cache. Afterwards logits() holds the last token's logits (only the last chunk runs the
  // output head); with all_logits, every token's logits ([n][n_vocab], from
  // all_logits_rows()). Throws std::invalid_argument before doing any work when a token id is
  // out of range or the context would overflow.
  // The tokens belong to sequence `seq` (0 .. n_seq-1) and go after its pos(seq).
  void eval(std::span<const int32_t> tokens, bool all_logits = false, int64_t seq = 0);

  // One token for each of several distinct sequences, each at its own next position, in one
  // pass (weights read once for all rows). Afterwards all_logits_rows() holds one row of
  // logits per token, in the order given, and logits() the last one. Throws
  // std::invalid_argument before doing any work when the spans differ in length, a sequence
  // is out of range or listed twice, a token id is out of range, or a sequence is full.
  void decode(std::span<const int32_t> tokens, std::span<const int64_t> seqs);

  // One pass over a mixed batch (the engine's step, forward_pass::step or begin/advance):
  // rows of several sequences, each sequence's rows consecutive and continuing it at its
  // pos() — a chunk of a prompt, or one decoded token. Afterwards all_logits_rows() holds one
  // row of logits per sequence, for its last row, in the order the sequences appear (or the
  // rows logit_rows asks for: forward_pass::begin). At most max_batch() rows. begin() throws
  // std::invalid_argument before doing any work for a bad token id or sequence, rows of a
  // sequence that are not consecutive, or a sequence that would overflow its context or KV.
  // Each advance() runs one layer (the last with the head).
  using forward_pass::begin;
  void begin(std::span<const int32_t> tokens, std::span<const int64_t> seqs, std::span<const int64_t> logit_rows) override;
  bool advance() override;
  int64_t max_logit_rows() const override { return max_batch_; }

  std::span<const float> logits() const { return {logits_.data() + (n_logit_rows_ - 1) * n_vocab_, static_cast<size_t>(n_vocab_)}; }
  std::span<const float> all_logits_rows() const override { return {logits_.data(), static_cast<size_t>(n_logit_rows_ * n_vocab_)}; }
  int64_t pos(int64_t seq = 0) const override { return pos_.at(static_cast<size_t>(seq)); }
  int64_t n_ctx() const { return n_ctx_; }
  int64_t n_seq() const { return static_cast<int64_t>(pos_.size()); }
  // Rows per forward pass: context_params::max_batch clamped to [1, n_ctx], at least n_seq.
  int64_t max_batch() const override { return max_batch_; }
  // Forgets a sequence (its cache is overwritten by the next eval).
  void reset(int64_t seq = 0) override;
  // Rolls a sequence back to an earlier position (e.g. to re-run the last prompt token).
  void truncate(int64_t pos, int64_t seq = 0) override;
  // An empty sequence whose first `pos` positions are already in its KV blocks (a prefix
  // adopted from a prefix cache) continues from there. Paged contexts only; throws
  // std::invalid_argument unless the sequence is empty and its blocks cover `pos`.
  void assume(int64_t pos, int64_t seq) override;
  // Positions before `end` of `seq` (a prompt's, or all of them with a large `end`, as the
  // engine asks) take the tiled attention kernel (kernels/cpu/ops.h,
  // attention_run::prompt_rows): f32 throughout, each key read once for a tile of rows; SwiGLU
  // with a vector e^x (swiglu_fast); packed Q4_1/Q5_1 products in the tile kernel's float order
  // (kernels::cpu::sum_order::tile). The same result however the sequence is chunked or
  // batched (where the matmuls give a row the same bits at any row count: packed and F32
  // weights), within float noise of llama.cpp's arithmetic rather than equal to it. 0 (the default, and after reset): every row is computed as
  // llama.cpp computes it.
  void set_prompt_end(int64_t seq, int64_t end) override;

 private:
  // Row r of the chunk is token tokens[r] of sequence seqs[r] at position positions[r]; rows
  // of one sequence are consecutive with consecutive positions. logits: where the output
  // head writes, or null to skip it (a chunk that is not the last); out_rows: the n_out rows
  // whose logits are written there in that order, or null for every row.
  void eval_chunk(const int32_t* tokens, const int64_t* seqs, const int64_t* positions, int64_t n, float* logits, const int64_t* out_rows,
                  int64_t n_out);
  // eval_chunk's first part: the pass set up and its embedding run; advance() runs the rest.
  void begin_chunk(const int32_t* tokens, const int64_t* seqs, const int64_t* positions, int64_t n, float* logits, const int64_t* out_rows,
                   int64_t n_out);
  void check_seq(int64_t seq) const;
  friend class cpu_pass;  // the recipe's ops over this context's cache and scratch (cpu_pass.h)

  const model& model_;
  kernels::cpu::thread_pool* pool_;
  weight_residency* residency_;
  kernels::cpu::kv_type kv_type_;
  bool kv_rotate_;
  kernels::cpu::rope_params rope_;
  int64_t n_ctx_;
  int64_t max_batch_;
  int64_t n_vocab_;
  std::vector<int64_t> pos_;  // next position of each sequence
  int64_t n_logit_rows_ = 1;
  std::vector<int64_t> row_seq_, row_pos_;  // per scratch row: sequence and position (eval_chunk)
  std::vector<int64_t> prompt_end_;         // per sequence: set_prompt_end
  // context_params::layer_teams on a pool of several threads: each member's private
  // activations, team_scratch_floats_ each (k_team_max_rows rows); empty otherwise.
  std::vector<float> team_scratch_;
  size_t team_scratch_floats_ = 0;
  std::vector<kernels::cpu::attention_run> runs_;  // one per sequence of a chunk (reserved)
  std::vector<int64_t> run_start_;                 // first row of each run of runs_, then the pass's rows (reserved)
  std::vector<int64_t> step_out_;                  // step(): the last row of each sequence's run

  // KV cache: one allocation on transparent huge pages, left uninitialised so pages (2 MiB
  // where the kernel grants them) are committed only as positions are written (attention
  // never reads past pos()). Per sequence, per layer,
  // [n_ctx][n_head_kv][head_dim] kv_type_ elements of K, then the same of V.
  memory::huge_buffer kv_;
  size_t kv_layer_bytes_ = 0;  // bytes of K (or V) of one layer of one sequence
  int64_t n_layer_ = 0;
  std::byte* k_cache(int64_t seq, int64_t layer) { return kv_.data() + (2 * static_cast<size_t>(seq * n_layer_ + layer)) * kv_layer_bytes_; }
  std::byte* v_cache(int64_t seq, int64_t layer) { return kv_.data() + (2 * static_cast<size_t>(seq * n_layer_ + layer) + 1) * kv_layer_bytes_; }
  // Paged: a block is [layer][K, V][block_tokens][n_head_kv * head_dim]; the K (which = 0) or
  // V (1) rows of a layer start at this offset of every block.
  memory::kv_pool* kv_pool_ = nullptr;
  size_t paged_part_bytes_ = 0;     // bytes of one layer's K (or V) rows in a block
  int64_t paged_block_stride_ = 0;  // bytes from one block to the next
  size_t paged_offset(int64_t layer, int which) const { return (2 * static_cast<size_t>(layer) + static_cast<size_t>(which)) * paged_part_bytes_; }
  // Writes len rows of k and v (positions p0 ..) into sequence s's blocks of a layer.
  void paged_store(int64_t s, int64_t layer, int64_t p0, const float* k, const float* v, int64_t len);
  void check_capacity(int64_t seq, int64_t end) const;
  // Scratch, max_batch rows each, carved from scratch_ (uninitialised, like kv_): x residual
  // stream [n_embd], xb normed input / branch output [n_embd], q [q_dim], k and v [kv_dim],
  // attn attention output [q_dim], ff_gate / ff_up feed-forward hidden [n_ff].
  std::unique_ptr<float[]> scratch_;
  float *x_ = nullptr, *xb_ = nullptr, *q_ = nullptr, *k_ = nullptr, *v_ = nullptr, *attn_ = nullptr, *ff_gate_ = nullptr, *ff_up_ = nullptr;
  float* rope_cs_ = nullptr;  // per row: RoPE's cos/sin of its position (rope_table)
  std::vector<float> logits_;
  std::vector<float> head_scratch_;  // logits of one piece of a head cut into pieces (weight_plan.h)
  // The pass begun and not yet over (forward.cpp); last, so it goes before what it uses.
  struct in_flight;
  std::unique_ptr<in_flight> flight_;
};

}  // namespace tandem::models
