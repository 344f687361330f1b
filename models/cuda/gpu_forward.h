// The forward pass of a Llama-family model on a CUDA device: the twin of forward_context
// (models/forward.h) running the kernels of kernels/cuda/ on weights and KV in device memory.
// Weights are the model's segments (weight_plan.h) in their file layout, either uploaded by
// this object (resident) or leased one layer at a time from a weight_residency whose arbiter
// runs the CUDA backend (layer-streamed: the copy of the next layers overlaps the compute of
// this one). The KV cache is paged exactly as on the CPU (one block table per sequence).
// Built only with the CUDA backend (TANDEM_HAVE_CUDA).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "memory/arbiter.h"
#include "memory/kv_pool.h"
#include "models/forward_pass.h"
#include "models/model.h"
#include "models/weight_residency.h"

namespace tandem::models {
struct gpu_device_state;
}

namespace tandem::models {

struct gpu_context_params {
  int64_t n_ctx = 0;        // per sequence; 0: min(training context, k_default_context)
  int64_t n_seq = 1;        // sequences (decode() takes one row of each at most)
  int64_t max_batch = 512;  // prompt rows per pass
  kernels::cpu::kv_type kv = kernels::cpu::kv_type::f16;
  bool kv_rotate = false;  // as context_params::kv_rotate (models/forward.h)
  int64_t block_tokens = 16;
  // The executor's paged KV cache instead of this object's own: sequence s is the pool's
  // sequence s, its positions in the blocks the caller reserved (on the device tier of an
  // arbiter running the CUDA backend, so pool->data() is device memory); block_tokens then
  // comes from the pool. The pool must outlive this object.
  memory::kv_pool* kv_pool = nullptr;
  // Where the activations, block tables, logits, GEMM scratch and cuBLAS workspace live: one
  // allocation from this arbiter's device tier, owned as scratch by `owner` (so the arbiter's
  // snapshot accounts for every byte the pass takes on the GPU); null: one cudaMalloc. The
  // arbiter must run the CUDA backend and outlive this object.
  memory::arbiter* scratch_arbiter = nullptr;
  std::string owner = {};
  // Replay decode-sized passes (up to kernels::cuda::k_matvec_max_rows rows, resident
  // weights) from CUDA graphs captured on first use: one launch instead of hundreds.
  // TANDEM_CUDA_GRAPHS=0 (or off) in the environment turns them off too (to measure what they save).
  bool cuda_graphs = true;
  // Rows of logits one pass may give (forward_pass::begin's logit_rows); at least n_seq, at
  // most the rows of a pass. The engine asks for room for its speculative rows.
  int64_t max_logit_rows = 0;
};

// Why the CUDA forward pass cannot run `m` (a weight type without CUDA kernels, an attention
// shape the kernel does not take, CPU-packed weights), or empty when it can. Needs no device.
std::string gpu_unsupported(const model& m);

class gpu_forward final : public forward_pass {
 public:
  // The model must have been loaded with load_options::pack_weights off (the CUDA kernels
  // read the file layout); throws std::invalid_argument otherwise, and std::runtime_error when
  // no device answers or memory cannot be had. residency null: the weights are uploaded here
  // (resident); otherwise segments are acquired from it layer by layer and must be device
  // memory of the CUDA backend. The model (and residency) must outlive this object.
  gpu_forward(const model& m, const gpu_context_params& p, weight_residency* residency = nullptr);
  ~gpu_forward();
  gpu_forward(const gpu_forward&) = delete;
  gpu_forward& operator=(const gpu_forward&) = delete;

  // Runs a prompt (in chunks of max_batch) after sequence seq's pos(); logits() then holds
  // the last token's logits. Throws std::invalid_argument for a bad token, sequence or an
  // overflowing context, before any work.
  void eval(std::span<const int32_t> tokens, int64_t seq = 0);
  // One token for each of several distinct sequences in one pass; all_logits_rows() then
  // holds one row per token in order.
  void decode(std::span<const int32_t> tokens, std::span<const int64_t> seqs);

  // The engine's pass (forward_pass::step, or begin/advance): rows of several sequences,
  // each sequence's rows consecutive; one row of logits per sequence, for its last row. At
  // most max_batch() rows. With leased weights each advance() queues one layer (the last
  // with the head); with fixed weights the first runs the whole pass (from a graph when it
  // is decode-sized).
  using forward_pass::begin;
  void begin(std::span<const int32_t> tokens, std::span<const int64_t> seqs, std::span<const int64_t> logit_rows) override;
  bool advance() override;
  // gpu_context_params::max_logit_rows (at least n_seq).
  int64_t max_logit_rows() const override { return max_out_; }
  void truncate(int64_t pos, int64_t seq) override;
  // Paged (kv_pool) contexts only: see forward_pass::assume.
  void assume(int64_t pos, int64_t seq) override;
  // The CUDA attention has one kernel (f32 throughout): nothing to choose.
  void set_prompt_end(int64_t, int64_t) override {}

  std::span<const float> logits() const;
  std::span<const float> all_logits_rows() const override { return {logits_.data(), static_cast<size_t>(n_logit_rows_ * n_vocab_)}; }
  int64_t pos(int64_t seq = 0) const override { return pos_.at(static_cast<size_t>(seq)); }
  void reset(int64_t seq = 0) override { pos_.at(static_cast<size_t>(seq)) = 0; }
  int64_t n_ctx() const { return n_ctx_; }
  // Rows per pass: max_batch clamped to [1, n_ctx], at least n_seq.
  int64_t max_batch() const override { return max_rows_; }
  // Device bytes this pass holds: uploaded weights (resident), its own KV, and its scratch
  // (activations, tables, logits, GEMM scratch; from the arbiter when it has one).
  uint64_t device_bytes() const;
  kernels::cuda::stream_t stream() const { return stream_.get(); }
  // Whether decode-sized passes replay CUDA graphs: false when turned off, or once the driver
  // refused a capture (the passes then launch kernel by kernel).
  bool graphs_enabled() const { return graphs_; }

 private:
  class uploaded_weights;
  void check_seq(int64_t seq) const;
  void check_capacity(int64_t seq, int64_t end) const;
  // Rows r0 .. of each sequence in the pass: its block table's offset in the tables buffer
  // (own KV: fixed; kv_pool: the pass's tables, copied before it).
  void upload_tables(const int64_t* seqs, int64_t n);
  // Rows r of the pass: token tokens[r] of sequence seqs[r] at position positions[r]; the
  // logits of rows out_rows[0 .. n_out) are copied to logits_.
  void run(const int32_t* tokens, const int64_t* seqs, const int64_t* positions, int64_t n, const int64_t* out_rows, int64_t n_out);
  // run()'s parts: the rows uploaded and the embedding queued (begin_run); the layers and
  // head from a graph (replay_layers); the logits copied back and positions moved (end_run).
  void begin_run(const int32_t* tokens, const int64_t* seqs, const int64_t* positions, int64_t n, const int64_t* out_rows, int64_t n_out);
  void replay_layers();
  void end_run();

  const model& model_;
  weight_residency* residency_;
  kernels::cuda::stream stream_;
  std::unique_ptr<gpu_device_state> d_;
  std::unique_ptr<uploaded_weights> uploaded_;  // resident mode: the segments this object uploaded
  kernels::cpu::rope_params rope_;
  kernels::cpu::kv_type kv_ = kernels::cpu::kv_type::f16;
  bool kv_rotate_ = false;
  int64_t block_tokens_ = 16;
  bool graphs_ = true;
  int64_t n_ctx_ = 0, max_batch_ = 0, max_rows_ = 0, max_out_ = 0, n_vocab_ = 0, blocks_per_seq_ = 0;
  memory::kv_pool* kv_pool_ = nullptr;
  memory::arbiter* scratch_arbiter_ = nullptr;
  std::optional<memory::allocation> scratch_;  // from scratch_arbiter_
  std::vector<int64_t> step_out_, row_pos_;
  std::vector<int64_t> pos_;
  std::vector<float> logits_;
  int64_t n_logit_rows_ = 1;
  // The pass begun and not yet over (gpu_forward.cpp); last, so it goes before what it uses.
  struct in_flight;
  std::unique_ptr<in_flight> flight_;
};

}  // namespace tandem::models
