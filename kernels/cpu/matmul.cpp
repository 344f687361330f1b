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
  if (rows < 0 || cols < 0 || n_x < 0)
    throw std::invalid_argument("matmul: negative shape (rows " + std::to_string(rows) + ", cols " +
                                std::to_string(cols) + ", n_x " + std::to_string(n_x) + ")");
  const dot_kernel& kernel = find_dot_kernel(wt);
  const int64_t block = std::max(info(wt).block_elems, info(kernel.act).block_elems);
  if (cols % block != 0)
    throw std::invalid_argument("matmul: " + display_name(wt) + " weights need cols to be a multiple of " +
                                std::to_string(block) + ", got " + std::to_string(cols));
  if (rows == 0 || n_x == 0) return;
  if (cols == 0) {
    std::fill(y, y + rows * n_x, 0.0f);
    return;
  }
  const dot_fn dot = select_dot(kernel, active_isa());
  const auto w_row = static_cast<size_t>(row_bytes(wt, cols));
  const auto a_row = static_cast<size_t>(row_bytes(kernel.act, cols));
  const auto* wb = static_cast<const uint8_t*>(w);

  // Convert each activation row once; every weight row then reuses it.
  const uint8_t* act = reinterpret_cast<const uint8_t*>(x);
  if (kernel.act != weight_type::f32) {
    thread_local std::vector<uint8_t> scratch;  // grows to the largest call, then reused
    const size_t need = a_row * static_cast<size_t>(n_x);
    if (scratch.size() < need) scratch.resize(need);
    uint8_t* dst = scratch.data();
    run(pool, n_x, std::max<int64_t>(1, k_min_chunk_convert / cols), [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) quantize_activation_row(kernel.act, x + r * cols, dst + r * a_row, cols);
    });
    act = dst;
  }

  // Work is split over groups of k_max_weight_rows output rows, the unit of one kernel call.
  const int64_t groups = (rows + k_max_weight_rows - 1) / k_max_weight_rows;
  auto group_rows = [rows](int64_t o) { return static_cast<int>(std::min<int64_t>(k_max_weight_rows, rows - o)); };

  if (n_x == 1) {
    // Decode: one activation row, the weights streamed once.
    run(pool, groups, std::max<int64_t>(1, k_min_chunk_work / (cols * k_max_weight_rows)), [&](int64_t b, int64_t e) {
      for (int64_t g = b; g < e; ++g) {
        const int64_t o = g * k_max_weight_rows;
        dot(cols, wb + o * w_row, w_row, group_rows(o), act, a_row, 1, y + o, rows);
      }
    });
    return;
  }

  // Prefill: each chunk of output rows is walked in tiles small enough to stay in cache;
  // every group of k_max_act_rows activation rows passes over the whole tile, and each
  // kernel call decodes a group of weight rows' blocks once for the whole group.
  const int64_t tile_groups = std::clamp<int64_t>(k_tile_weight_bytes / static_cast<int64_t>(w_row * k_max_weight_rows), 1,
                                                  k_max_tile_rows / k_max_weight_rows);
  run(pool, groups, std::max<int64_t>(1, k_min_chunk_work / (cols * n_x * k_max_weight_rows)), [&](int64_t b, int64_t e) {
    for (int64_t g0 = b; g0 < e; g0 += tile_groups) {
      const int64_t g1 = std::min(e, g0 + tile_groups);
      for (int64_t r0 = 0; r0 < n_x; r0 += k_max_act_rows) {
        const int nr = static_cast<int>(std::min<int64_t>(k_max_act_rows, n_x - r0));
        for (int64_t g = g0; g < g1; ++g) {
          const int64_t o = g * k_max_weight_rows;
          dot(cols, wb + o * w_row, w_row, group_rows(o), act + r0 * a_row, a_row, nr, y + r0 * rows + o, rows);
        }
      }
    }
  });
}

}  // namespace tandem::kernels::cpu
