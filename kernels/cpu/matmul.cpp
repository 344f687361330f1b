#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/act_quant.h"
#include "kernels/cpu/vec_dot.h"

namespace tandem::kernels::cpu {
namespace {

// Multiply-adds one pool chunk should carry at least; below this a wakeup of the workers
// costs more than it saves (a few microseconds against ~1 ns per element per core).
constexpr int64_t k_min_chunk_work = 64 * 1024;
// Activation elements one chunk of the activation conversion should carry at least.
constexpr int64_t k_min_chunk_convert = 16 * 1024;
// Weight bytes one prefill tile keeps hot while every group of activation rows passes over
// it: about half of a typical 48-64 KiB L1d plus 1-2 MiB L2 leaves room for the activations.
constexpr int64_t k_tile_weight_bytes = 32 * 1024;
constexpr int64_t k_max_tile_rows = 64;

// range_fn refers to the caller's lambda without copying it, so no call allocates here.
void run(thread_pool* pool, int64_t n, int64_t grain, range_fn body) {
  if (pool)
    pool->parallel_for(n, grain, body);
  else if (n > 0)
    body(0, n);
}

}  // namespace

void matmul(weight_type wt, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n_x, float* y,
            thread_pool* pool) {
  const matmul_job job{wt, w, rows, y};
  matmul_many(&job, 1, cols, x, n_x, pool);
}

void matmul_many(const matmul_job* jobs, int n_jobs, int64_t cols, const float* x, int64_t n_x, thread_pool* pool) {
  if (n_jobs < 0 || n_jobs > k_max_matmul_jobs)
    throw std::invalid_argument("matmul: " + std::to_string(n_jobs) + " jobs, at most " + std::to_string(k_max_matmul_jobs));
  if (cols < 0 || n_x < 0)
    throw std::invalid_argument("matmul: negative shape (cols " + std::to_string(cols) + ", n_x " + std::to_string(n_x) + ")");

  // Per job: kernel, row sizes, and where its row groups start in the joint numbering.
  struct plan {
    const dot_kernel* kernel;
    dot_fn dot;
    size_t w_row, a_row;
    int act_slot;  // which converted copy of x it reads
    int64_t first_group, groups;
  };
  plan plans[k_max_matmul_jobs];
  weight_type act_types[k_max_matmul_jobs];
  size_t act_offsets[k_max_matmul_jobs + 1] = {0};
  int n_act_types = 0;
  int64_t total_groups = 0;
  const isa path = active_isa();
  for (int j = 0; j < n_jobs; ++j) {
    const matmul_job& job = jobs[j];
    if (job.rows < 0) throw std::invalid_argument("matmul: negative shape (rows " + std::to_string(job.rows) + ")");
    const dot_kernel& kernel = find_dot_kernel(job.wt);
    const int64_t block = std::max(info(job.wt).block_elems, info(kernel.act).block_elems);
    if (cols % block != 0)
      throw std::invalid_argument("matmul: " + display_name(job.wt) + " weights need cols to be a multiple of " +
                                  std::to_string(block) + ", got " + std::to_string(cols));
    plan& p = plans[j];
    p.kernel = &kernel;
    p.dot = select_dot(kernel, path);
    p.w_row = static_cast<size_t>(row_bytes(job.wt, cols));
    p.a_row = static_cast<size_t>(row_bytes(kernel.act, cols));
    p.act_slot = 0;
    while (p.act_slot < n_act_types && act_types[p.act_slot] != kernel.act) ++p.act_slot;
    if (p.act_slot == n_act_types) {
      act_types[n_act_types] = kernel.act;
      act_offsets[n_act_types + 1] = act_offsets[n_act_types] + p.a_row * static_cast<size_t>(n_x);
      ++n_act_types;
    }
    p.first_group = total_groups;
    p.groups = (job.rows + k_max_weight_rows - 1) / k_max_weight_rows;
    total_groups += p.groups;
  }
  if (n_x == 0 || total_groups == 0) return;
  if (cols == 0) {
    for (int j = 0; j < n_jobs; ++j) std::fill(jobs[j].y, jobs[j].y + jobs[j].rows * n_x, 0.0f);
    return;
  }

  // Convert each activation row once per activation type; every weight row then reuses it.
  // F32 activations are read in place.
  thread_local std::vector<uint8_t> scratch;  // grows to the largest call, then reused
  if (scratch.size() < act_offsets[n_act_types]) scratch.resize(act_offsets[n_act_types]);
  const uint8_t* act[k_max_matmul_jobs];
  bool any_convert = false;
  for (int k = 0; k < n_act_types; ++k) {
    act[k] = act_types[k] == weight_type::f32 ? reinterpret_cast<const uint8_t*>(x) : scratch.data() + act_offsets[k];
    any_convert = any_convert || act_types[k] != weight_type::f32;
  }
  if (any_convert) {
    uint8_t* base = scratch.data();
    run(pool, n_x * n_act_types, std::max<int64_t>(1, k_min_chunk_convert / cols), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const auto k = static_cast<int>(i / n_x);
        const int64_t r = i % n_x;
        if (act_types[k] == weight_type::f32) continue;
        const size_t a_row = static_cast<size_t>(row_bytes(act_types[k], cols));
        quantize_activation_row(act_types[k], x + r * cols, base + act_offsets[k] + r * a_row, cols);
      }
    });
  }

  // Row groups [b, e) of the joint numbering, job by job. Decode (one activation row)
  // streams each group's weights once; prefill walks each job's part in tiles small enough to
  // stay in cache while every group of k_max_act_rows activation rows passes over the tile,
  // each kernel call decoding a group of weight rows once for the whole activation group.
  auto body = [&](int64_t b, int64_t e) {
    for (int j = 0; j < n_jobs; ++j) {
      const plan& p = plans[j];
      const int64_t g_begin = std::max(b, p.first_group) - p.first_group;
      const int64_t g_end = std::min(e, p.first_group + p.groups) - p.first_group;
      if (g_begin >= g_end) continue;
      const int64_t rows = jobs[j].rows;
      const auto* wb = static_cast<const uint8_t*>(jobs[j].w);
      const uint8_t* a = act[p.act_slot];
      float* y = jobs[j].y;
      auto group_rows = [rows](int64_t o) { return static_cast<int>(std::min<int64_t>(k_max_weight_rows, rows - o)); };
      if (n_x == 1) {
        for (int64_t g = g_begin; g < g_end; ++g) {
          const int64_t o = g * k_max_weight_rows;
          p.dot(cols, wb + o * p.w_row, p.w_row, group_rows(o), a, p.a_row, 1, y + o, rows);
        }
        continue;
      }
      const int64_t tile = std::clamp<int64_t>(k_tile_weight_bytes / static_cast<int64_t>(p.w_row * k_max_weight_rows), 1,
                                               k_max_tile_rows / k_max_weight_rows);
      for (int64_t g0 = g_begin; g0 < g_end; g0 += tile) {
        const int64_t g1 = std::min(g_end, g0 + tile);
        for (int64_t r0 = 0; r0 < n_x; r0 += k_max_act_rows) {
          const int nr = static_cast<int>(std::min<int64_t>(k_max_act_rows, n_x - r0));
          for (int64_t g = g0; g < g1; ++g) {
            const int64_t o = g * k_max_weight_rows;
            p.dot(cols, wb + o * p.w_row, p.w_row, group_rows(o), a + r0 * p.a_row, p.a_row, nr, y + r0 * rows + o, rows);
          }
        }
      }
    }
  };
  run(pool, total_groups, std::max<int64_t>(1, k_min_chunk_work / (cols * n_x * k_max_weight_rows)), body);
}

}  // namespace tandem::kernels::cpu
