// The CPU backend of a recipe (recipe.h): one pass of a forward_context (forward.h) over the
// kernels of kernels/cpu/. Internal to forward.cpp and cpu_pass.cpp.
//
// A layer runs in one of two ways, with the same bits:
// - by steps: each op one call, its products split and balanced over the pool
//   (parallel_for), the small per-run ops (biases, norms, RoPE, KV stores) on the caller;
// - as a team (decode steps of up to k_team_max_rows rows of one arithmetic on a pool of
//   several threads): the whole layer is one thread_pool::run_team job, every member running
//   every op on its fixed part (products by output rows, attention by tasks, per-run ops by
//   runs, row-wise norms duplicated into a private copy), with a barrier only where an op
//   reads what other members wrote. Which barriers a layer needs follows from the order of
//   its ops (team_ops), so a recipe needs no knowledge of teams.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "models/forward.h"
#include "models/recipe_runner.h"

namespace tandem::models {

class cpu_pass final : public pass_backend {
 public:
  // Rows r < n: token tokens[r] of sequence seqs[r] at positions[r]; the context's runs_ and
  // run_start_ describe the runs of consecutive rows of one sequence, rope_cs_ holds each
  // row's cos/sin. logits: where the head writes row k's logits (stride n_vocab), for rows
  // out_rows[k] (k < n_out), or every row when out_rows is null; null: no head.
  cpu_pass(forward_context& f, const int32_t* tokens, const int64_t* seqs, const int64_t* positions, int64_t n, float* logits,
           const int64_t* out_rows, int64_t n_out, bool team);

  void embed(const weight_view& table, int64_t row0) override;
  void run_layer(int64_t layer, layer_body body) override;
  void output_norm(const float* w) override;
  void head(const weight_view& head, int64_t col0) override;
  bool asynchronous() const override { return false; }
  void drain() override {}
  void mark(int) override {}
  void wait_mark(int) override {}

  // Shared by both ways of running a layer (cpu_pass.cpp).
  forward_context& f;
  const model_config& c;
  kernels::cpu::thread_pool* pool;
  kernels::cpu::kv_type kv;
  bool rotate;  // the cache holds rotated rows (context_params::kv_rotate)
  const kernels::cpu::rope_params& rope;
  const float* rope_cs;                            // per row: RoPE's cos/sin (head_dim floats)
  std::vector<kernels::cpu::attention_run>& runs;  // one per run of consecutive rows of a sequence
  const std::vector<int64_t>& run_start;           // each run's first row, then n
  const std::vector<int64_t>& prompt_end;          // per sequence (forward_context::set_prompt_end)
  float* team_scratch;                             // team members' private activations, or null
  size_t team_scratch_floats;                      // per member
  const int32_t* tokens;
  const int64_t* seqs;
  const int64_t* positions;
  int64_t n;
  float* logits;
  const int64_t* out_rows;
  int64_t n_out;
  bool team;

  float* buf(act a) const;
  int64_t width(act a) const;
  // Whether row r takes the server's arithmetic (forward_context::set_prompt_end).
  bool fast(int64_t r) const { return positions[r] < prompt_end[static_cast<size_t>(seqs[r])]; }
  // Per-run work of runs [i0, i1): KV stores, and the attention_run of each run.
  // Stores the rows of runs [i0, i1) of k and v, rotating them in place first where the cache
  // is rotated (context_params::kv_rotate).
  void store_runs(int64_t layer, int64_t i0, int64_t i1, float* k, float* v);
  // Rows [r0, r1) of a (n_heads heads, width floats a row) through the Hadamard rotation in
  // place where the cache is rotated: queries before attention, its output after.
  void rotate_rows(float* a, int64_t width, int64_t n_heads, int64_t r0, int64_t r1) const;
  void set_runs(int64_t layer, int64_t i0, int64_t i1, const float* q, float* out);
};

}  // namespace tandem::models
