// Internal to the products of matmul.h. A call goes in three steps: the plan (which layout,
// kernel and activation forms each job takes, and how its rows are cut into groups), the
// conversion of the activations into those forms (both matmul_plan.cpp), and one runner per
// weight layout over a range of a job's row groups (matmul_run.cpp). matmul.cpp puts them
// together on the caller, over a pool or as one member's team part.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/vec_dot.h"
#include "kernels/weight_type.h"

namespace tandem::kernels::cpu {

// How one job of a call runs: its kernel and row sizes, its layout, which activation forms
// it reads, and where its row groups start in the call's joint numbering.
struct matmul_job_plan {
  const dot_kernel* kernel;
  dot_fn dot;                   // the row-tile kernel of the active path (row tiles only)
  size_t w_row;                 // bytes of one weight row in the file layout
  size_t a_row;                 // bytes of one activation row converted to kernel->act
  int act_slot;                 // which converted copy of x it reads
  bool packed;                  // the weights are packed panels (packed.h)
  bool panel;                   // panels of k_panel_rows rows (packed, or packed per call) instead of row tiles
  int panel_slot;               // which panel form of that copy (panel paths only)
  int64_t first_group, groups;  // groups of k_panel_rows (panels) or k_max_weight_rows rows
};

// Everything a call takes, decided from the jobs, the shape and the active path before any
// work: per job its plan, the activation forms the jobs share, their bytes in one set of
// scratch, and the joint numbering of row groups that the pool splits.
struct matmul_plan {
  isa path;
  bool amx;  // expanded and per-call panels run on the AMX tile unit (the same bits)
  int64_t cols, n_x;
  int n_jobs;
  matmul_job_plan jobs[k_max_matmul_jobs];
  // Converted copies of x, one per distinct activation type, each at act_offsets[k] (F32 is
  // read in place); row_form[k]: some job reads copy k row by row, so it is converted.
  weight_type act_types[k_max_matmul_jobs];
  size_t act_offsets[k_max_matmul_jobs + 1];
  int n_act_types;
  bool row_form[k_max_matmul_jobs];
  bool any_convert;  // some copy other than F32 is converted
  // Panel forms (panel.h: int8 codes, {da, da * sum, offset term} per sub-block), one per
  // distinct (activation type, sub-block size, code offset), named by the first weight type
  // that reads it. tiled_slot[k]: a packed job reads slot k in the tiled form
  // (tile_packed_acts); row_panel[k]: a job reads slot k's panel form row by row.
  weight_type panel_types[k_max_matmul_jobs];
  int n_panel_slots;
  bool tiled_slot[k_max_matmul_jobs];
  bool row_panel[k_max_matmul_jobs];
  bool panels_from_x;  // panel forms come straight from x (panel_act_row), not from the rows
  // Bytes of one set of forms: the converted rows (act_total), then at a 64-byte boundary per
  // panel slot its codes (code_bytes) and aux floats (aux_bytes), twice where tiled.
  size_t code_bytes, act_total, panel_total, forms_bytes;
  int64_t total_groups;
  // A gated call whose gate and up cut rows alike: group g is both products' group g, so a
  // chunk holds both products of its rows for the activation (matmul.cpp).
  bool paired;

  size_t aux_bytes(int k) const;
};

// Checks the jobs and the shape (throws std::invalid_argument as matmul.h documents) and
// plans the call on the active path. gated: jobs[0] and jobs[1] are a gate and an up whose
// SwiGLU follows (matmul_swiglu).
matmul_plan plan_matmul(const matmul_job* jobs, int n_jobs, int64_t cols, int64_t n_x, bool gated);

// Where one set of a call's activation forms lies (matmul_plan: the copies and slots).
struct matmul_forms {
  const uint8_t* act[k_max_matmul_jobs] = {};
  int8_t* panel_codes[k_max_matmul_jobs] = {};
  float* panel_aux[k_max_matmul_jobs] = {};
  int8_t* tiled_codes[k_max_matmul_jobs] = {};
  float* tiled_aux[k_max_matmul_jobs] = {};
};

// Lays f out at `at` (64-byte aligned, plan.forms_bytes long) and converts every row of x
// into it, split over `on` (null: on this thread). Allocates nothing and cannot throw.
void convert_activations(const matmul_plan& plan, const float* x, uint8_t* at, matmul_forms& f, thread_pool* on);

// Asks at once for the start of a job's row groups [g_begin, g_end) that the kernels' own
// requests would leave to demand misses (matmul_run.cpp says which bytes, at which level).
void prefetch_groups(const matmul_plan& plan, const matmul_job& job, const matmul_job_plan& p, int64_t g_begin, int64_t g_end);

// The runners: row groups [g_begin, g_end) of one job, against every activation row, writing
// their rows of job.y. One per weight layout: packed panels (packed.h), panels packed per call
// (panel.h), row tiles (vec_dot.h).
void run_packed(const matmul_plan& plan, const matmul_job& job, const matmul_job_plan& p, const matmul_forms& f, int64_t g_begin, int64_t g_end);
void run_panels(const matmul_plan& plan, const matmul_job& job, const matmul_job_plan& p, const matmul_forms& f, int64_t g_begin, int64_t g_end);
void run_rows(const matmul_plan& plan, const matmul_job& job, const matmul_job_plan& p, const matmul_forms& f, int64_t g_begin, int64_t g_end);

// body over [0, n) on the pool, or on this thread when pool is null. range_fn refers to the
// caller's lambda without copying it, so no call allocates here.
inline void run_split(thread_pool* pool, int64_t n, int64_t grain, range_fn body) {
  if (pool)
    pool->parallel_for(n, grain, body);
  else if (n > 0)
    body(0, n);
}

// A per-thread buffer of at least `bytes` bytes at a 64-byte boundary, reused across calls.
inline uint8_t* aligned_scratch(std::vector<uint8_t>& buf, size_t bytes) {
  if (buf.size() < bytes + 64) buf.resize(bytes + 64);
  const auto p = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((64 - p % 64) % 64);
}

}  // namespace tandem::kernels::cpu
