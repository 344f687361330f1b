// What the serving engine asks of a forward pass over a paged KV cache, whichever device runs
// it: forward_context (models/forward.h) on the CPU kernels, gpu_forward
// (models/cuda/gpu_forward.h) on a CUDA device. Each sequence's positions live in the blocks
// its caller reserved in a memory::kv_pool.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace tandem::models {

class forward_pass {
 public:
  virtual ~forward_pass() = default;
  // One pass over rows of several sequences, each sequence's rows consecutive and continuing
  // it at its pos(): afterwards all_logits_rows() holds one row of logits per sequence (for
  // its last row), in the order the sequences appear. Throws std::invalid_argument before
  // doing any work on bad input.
  void step(std::span<const int32_t> tokens, std::span<const int64_t> seqs, std::span<const int64_t> logit_rows = {}) {
    begin(tokens, seqs, logit_rows);
    while (!advance()) {
    }
  }
  // The same pass in parts, for a caller that does other work at its yield points: begin()
  // checks and lays out the rows (throwing as step() does, before any work) and queues the
  // embedding; each advance() runs up to the next yield point (the next layer, or all that
  // is left where the pass cannot stop: a replayed graph, weights that never move) and
  // returns true once the pass is over and its logits are ready. Between two advance() calls
  // none of the pass's work runs on the host and it holds at most its current layer's weight
  // lease, so passes of another model whose weights are on the device may run there
  // (runtime/engine_interleave.cpp). tokens and seqs stay the caller's until then. An
  // exception from advance() ends the pass (positions unmoved, leases released); begin()
  // while a pass is unfinished abandons that one.
  void begin(std::span<const int32_t> tokens, std::span<const int64_t> seqs) { begin(tokens, seqs, {}); }
  // logit_rows: for each run of a sequence's rows, in order, how many of its last rows give
  // logits (at least 1, at most the run's rows; empty: 1 each). all_logits_rows() then holds
  // those rows, in row order. For verifying speculative tokens: a sequence's last token and k
  // proposals as k + 1 rows, each row's logits. At most max_logit_rows() in all.
  virtual void begin(std::span<const int32_t> tokens, std::span<const int64_t> seqs, std::span<const int64_t> logit_rows) = 0;
  virtual bool advance() = 0;
  virtual std::span<const float> all_logits_rows() const = 0;
  virtual int64_t pos(int64_t seq) const = 0;
  virtual int64_t max_batch() const = 0;  // rows per step
  virtual void reset(int64_t seq) = 0;    // forget the sequence
  // Forgets the sequence's positions from `pos` on (rejected speculative tokens): the next row
  // continues at `pos`. Throws std::invalid_argument for a position beyond pos(seq).
  virtual void truncate(int64_t pos, int64_t seq) = 0;
  // Rows of logits one pass can give (logit_rows summed over the runs).
  virtual int64_t max_logit_rows() const = 0;
  // An empty sequence whose first `pos` positions are already in its KV blocks (a prefix
  // cache hit) continues from there.
  virtual void assume(int64_t pos, int64_t seq) = 0;
  // Which arithmetic the rows before `end` take, where the device has a choice (the CPU: the
  // tiled f32 attention, SwiGLU's vector e^x and the Q4_1/Q5_1 tile order, or llama.cpp's f16
  // attention, expf and ggml's order); a no-op elsewhere.
  virtual void set_prompt_end(int64_t seq, int64_t end) = 0;
};

// The rows of a step() checked and laid out, before any work, for both forward passes: rows
// of one sequence must be consecutive and a sequence may not come back after another's run;
// token ids in [0, n_vocab); at most max_rows rows. pos_of(seq) gives a sequence's next
// position and throws std::invalid_argument for one out of range; fits(seq, end) throws it
// when the sequence cannot hold positions up to `end` (context, KV blocks). Fills out_rows
// with the rows that give logits (each run's last logit_rows[k] rows, as forward_pass::begin;
// at most max_out of them) and row_pos[i] with row i's position. Throws
// std::invalid_argument naming what is wrong.
void lay_out_step(std::span<const int32_t> tokens, std::span<const int64_t> seqs, std::span<const int64_t> logit_rows, int64_t n_vocab,
                  int64_t max_rows, int64_t max_out, const std::function<int64_t(int64_t)>& pos_of, const std::function<void(int64_t, int64_t)>& fits,
                  std::vector<int64_t>& out_rows, int64_t* row_pos);

// The checks of assume() for both forward passes: throws std::invalid_argument unless the
// context is paged (capacity is the sequence's KV capacity, or < 0 without a pool), the
// sequence is empty (cur_pos 0) and its blocks cover `pos` within n_ctx.
void check_assume(int64_t pos, int64_t seq, int64_t cur_pos, int64_t n_ctx, int64_t capacity);

}  // namespace tandem::models
