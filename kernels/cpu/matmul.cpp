// The products of matmul.h: the entry points, and one call's steps (matmul_impl.h) put
// together on the caller, over a pool or as one member's team part.
#include "kernels/cpu/matmul.h"

#include <xmmintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/cpu/matmul_impl.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/panel.h"

namespace tandem::kernels::cpu {
namespace {

// Multiply-adds one pool chunk should carry at least; below this a wakeup of the workers
// costs more than it saves (a few microseconds against ~1 ns per element per core).
constexpr int64_t k_min_chunk_work = 64 * 1024;
// Up to this many activation rows, each thread of a pool converts them all for itself (see
// multiply); more, and they are converted once, split over the pool.
constexpr int64_t k_own_forms_max_rows = 16;

}  // namespace

int64_t matmul_chunk_groups(int64_t cols, int64_t n_x, int64_t group_rows) {
  // A group's rows differ by path: counted as k_max_weight_rows rows, panel chunks would be
  // four times too big (a 576 x 576 packed decode product, 36 panels, on one thread).
  return std::max<int64_t>(1, k_min_chunk_work / std::max<int64_t>(1, cols * n_x * std::max<int64_t>(1, group_rows)));
}

void matmul(weight_type wt, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n_x, float* y, thread_pool* pool, weight_layout layout,
            sum_order order) {
  const matmul_job job{wt, w, rows, y, layout, order};
  matmul_many(&job, 1, cols, x, n_x, pool);
}

namespace {

// What a gated call applies to each chunk's rows once both products are in (matmul_swiglu).
enum class epilogue { none, swiglu_expf, swiglu_vector };

void apply_epilogue(epilogue gate, float* g, const float* u, int64_t n, thread_pool* pool) {
  if (gate == epilogue::swiglu_expf)
    swiglu(g, u, n, pool);
  else
    swiglu_fast(g, u, n, pool);
}

// Zeroes the outputs of a call with no columns: a part its share of the first job's rows, and
// all of the others' when it is the first (nothing reads them before the team syncs).
row_span zero_outputs(const matmul_job* jobs, int n_jobs, int64_t n_x, const team_part* part) {
  if (part) {
    const int64_t r0 = share_start(jobs[0].rows, part->count, part->index);
    const int64_t r1 = share_start(jobs[0].rows, part->count, part->index + 1);
    for (int64_t r = 0; r < n_x; ++r) std::fill(jobs[0].y + r * jobs[0].rows + r0, jobs[0].y + r * jobs[0].rows + r1, 0.0f);
    if (part->index == 0)
      for (int j = 1; j < n_jobs; ++j) std::fill(jobs[j].y, jobs[j].y + jobs[j].rows * n_x, 0.0f);
    return {r0, r1};
  }
  for (int j = 0; j < n_jobs; ++j) std::fill(jobs[j].y, jobs[j].y + jobs[j].rows * n_x, 0.0f);
  return {0, jobs[0].rows};
}

// One product call: the plan, then the activations converted where the plan and the threads
// need them, then the row groups split over the pool (or one member's share with part, on
// this thread; pool is then ignored), each chunk running every job's runner over its groups.
row_span multiply(const matmul_job* jobs, int n_jobs, int64_t cols, const float* x, int64_t n_x, thread_pool* pool, epilogue gate,
                  const team_part* part = nullptr) {
  if (part && (part->count < 1 || part->index < 0 || part->index >= part->count))
    throw std::invalid_argument("matmul: team part " + std::to_string(part->index) + " of " + std::to_string(part->count));
  const matmul_plan plan = plan_matmul(jobs, n_jobs, cols, n_x, gate != epilogue::none);
  if (n_x == 0 || plan.total_groups == 0) return {};
  if (cols == 0) return zero_outputs(jobs, n_jobs, n_x, part);

  // On a pool, the rows are converted inside the job, where the other threads have work
  // meanwhile. Decode: the caller converts its one row in its first chunk while each other
  // thread asks memory for the start of its own chunk and waits on `converted`, so the
  // weights' first lines arrive during the conversion and the wakeup instead of after them.
  // Small batches: every thread converts all the rows itself, into buffers of its own, in its
  // first chunk (after the same request): converted once on the caller, a batch of 8 took
  // 4.7 µs a product on two threads against 2.9 on one, the others reading it from the
  // caller's cache. Larger batches convert first, split over the pool.
  if (part) pool = nullptr;
  const bool on_pool = pool != nullptr && pool->size() > 1;
  const bool shared_in_job = on_pool && n_x == 1;
  const bool own_forms = on_pool && n_x > 1 && n_x <= k_own_forms_max_rows;
  // All of a call's forms live in the caller's buffer, grown here (so only the caller ever
  // allocates, and a warm call never does): one set, or with own_forms one set per thread of
  // the pool, thread i's at set i (the caller's first; the others in the order they arrive).
  thread_local std::vector<uint8_t> buf;
  const size_t sets = own_forms ? static_cast<size_t>(pool->size()) : 1;
  uint8_t* const base = aligned_scratch(buf, plan.forms_bytes * sets);
  std::atomic<size_t> next_set{1};
  matmul_forms shared;
  if (!part && !own_forms && !shared_in_job) convert_activations(plan, x, base, shared, pool);
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> converted{false};  // the caller has converted (which cannot throw: no allocation)
  static std::atomic<uint64_t> calls{0};
  const uint64_t call = own_forms ? calls.fetch_add(1, std::memory_order_relaxed) + 1 : 0;  // tells a thread's forms stale
  // Asks at once for the start of chunk [b, e): its first job's part.
  auto prefetch_start = [&](int64_t b, int64_t e) {
    for (int j = 0; j < n_jobs; ++j) {
      const matmul_job_plan& p = plan.jobs[j];
      const int64_t g_begin = std::max(b, p.first_group) - p.first_group;
      const int64_t g_end = std::min(e, p.first_group + p.groups) - p.first_group;
      if (g_begin < g_end) return prefetch_groups(plan, jobs[j], p, g_begin, g_end);
    }
  };

  // Row groups [b, e) of the joint numbering, job by job, each on its layout's runner.
  auto body = [&](int64_t b, int64_t e) {
    const matmul_forms* fp = &shared;
    if (shared_in_job && !converted.load(std::memory_order_acquire)) {
      prefetch_start(b, e);
      if (std::this_thread::get_id() == caller) {
        convert_activations(plan, x, base, shared, nullptr);
        converted.store(true, std::memory_order_release);
      } else {
        while (!converted.load(std::memory_order_acquire)) _mm_pause();
      }
    }
    if (own_forms) {
      thread_local matmul_forms own;
      thread_local uint64_t own_call = 0;
      if (own_call != call) {
        prefetch_start(b, e);
        const size_t set = std::this_thread::get_id() == caller ? 0 : next_set.fetch_add(1, std::memory_order_relaxed);
        convert_activations(plan, x, base + set * plan.forms_bytes, own, nullptr);
        own_call = call;
      }
      fp = &own;
    }
    const matmul_forms& f = *fp;
    for (int j = 0; j < n_jobs; ++j) {
      const matmul_job_plan& p = plan.jobs[j];
      const int64_t g_begin = std::max(b, p.first_group) - p.first_group;
      const int64_t g_end = std::min(e, p.first_group + p.groups) - p.first_group;
      if (g_begin >= g_end) continue;
      if (p.packed)
        run_packed(plan, jobs[j], p, f, g_begin, g_end);
      else if (p.panel)
        run_panels(plan, jobs[j], p, f, g_begin, g_end);
      else
        run_rows(plan, jobs[j], p, f, g_begin, g_end);
    }
    if (plan.paired) {
      // The chunk's rows of both products are still in cache: gate = silu(gate) * up.
      const int64_t rows = jobs[0].rows, group_rows = plan.jobs[0].panel ? k_panel_rows : k_max_weight_rows;
      const int64_t o0 = b * group_rows, o1 = std::min(e * group_rows, rows);
      for (int64_t r = 0; r < n_x; ++r) apply_epilogue(gate, jobs[0].y + r * rows + o0, jobs[1].y + r * rows + o0, o1 - o0, nullptr);
    }
  };
  if (part) {
    if (gate != epilogue::none && !plan.paired) {
      // Gate and up cut rows differently (16 or 4 a group): the share is whole units of
      // k_panel_rows rows, a whole number of groups of either, so both products of its rows
      // are here for the activation.
      const int64_t rows = jobs[0].rows, units = (rows + k_panel_rows - 1) / k_panel_rows;
      const int64_t r0 = std::min(rows, share_start(units, part->count, part->index) * k_panel_rows);
      const int64_t r1 = std::min(rows, share_start(units, part->count, part->index + 1) * k_panel_rows);
      if (r0 >= r1) return {r0, r0};
      auto groups_of = [&](int j) {
        const int64_t gr = plan.jobs[j].panel ? k_panel_rows : k_max_weight_rows;
        return std::pair{plan.jobs[j].first_group + r0 / gr, plan.jobs[j].first_group + (r1 + gr - 1) / gr};
      };
      prefetch_start(groups_of(0).first, groups_of(0).second);
      convert_activations(plan, x, base, shared, nullptr);
      for (int j = 0; j < 2; ++j) body(groups_of(j).first, groups_of(j).second);
      for (int64_t r = 0; r < n_x; ++r) apply_epilogue(gate, jobs[0].y + r * rows + r0, jobs[1].y + r * rows + r0, r1 - r0, nullptr);
      return {r0, r1};
    }
    const int64_t b = share_start(plan.total_groups, part->count, part->index);
    const int64_t e = share_start(plan.total_groups, part->count, part->index + 1);
    if (b < e) {
      prefetch_start(b, e);
      convert_activations(plan, x, base, shared, nullptr);
      body(b, e);
    }
    const int64_t gr = plan.jobs[0].panel ? k_panel_rows : k_max_weight_rows;
    const int64_t g0 = std::clamp<int64_t>(b, 0, plan.jobs[0].groups), g1 = std::clamp<int64_t>(e, 0, plan.jobs[0].groups);
    return {std::min(g0 * gr, jobs[0].rows), std::min(g1 * gr, jobs[0].rows)};
  }
  // Rows per group over the whole call: 16 on the panel paths, 4 on the row kernels, between
  // them when one call mixes the two.
  int64_t total_rows = 0;
  for (int j = 0; j < n_jobs; ++j) total_rows += jobs[j].rows;
  run_split(pool, plan.total_groups, matmul_chunk_groups(cols, n_x, std::max<int64_t>(1, total_rows / plan.total_groups)), body);
  if (gate != epilogue::none && !plan.paired) apply_epilogue(gate, jobs[0].y, jobs[1].y, jobs[0].rows * n_x, pool);
  return {0, jobs[0].rows};
}

}  // namespace

void matmul_many(const matmul_job* jobs, int n_jobs, int64_t cols, const float* x, int64_t n_x, thread_pool* pool) {
  multiply(jobs, n_jobs, cols, x, n_x, pool, epilogue::none);
}

void matmul_swiglu(const matmul_job& gate, const matmul_job& up, int64_t cols, const float* x, int64_t n_x, thread_pool* pool, swiglu_exp exp) {
  if (gate.rows != up.rows)
    throw std::invalid_argument("matmul_swiglu: gate has " + std::to_string(gate.rows) + " rows, up " + std::to_string(up.rows));
  const matmul_job jobs[2] = {gate, up};
  multiply(jobs, 2, cols, x, n_x, pool, exp == swiglu_exp::expf ? epilogue::swiglu_expf : epilogue::swiglu_vector);
}

row_span matmul_many_part(const matmul_job* jobs, int n_jobs, int64_t cols, const float* x, int64_t n_x, team_part part) {
  return multiply(jobs, n_jobs, cols, x, n_x, nullptr, epilogue::none, &part);
}

row_span matmul_swiglu_part(const matmul_job& gate, const matmul_job& up, int64_t cols, const float* x, int64_t n_x, team_part part, swiglu_exp exp) {
  if (gate.rows != up.rows)
    throw std::invalid_argument("matmul_swiglu: gate has " + std::to_string(gate.rows) + " rows, up " + std::to_string(up.rows));
  const matmul_job jobs[2] = {gate, up};
  return multiply(jobs, 2, cols, x, n_x, nullptr, exp == swiglu_exp::expf ? epilogue::swiglu_expf : epilogue::swiglu_vector, &part);
}

}  // namespace tandem::kernels::cpu
