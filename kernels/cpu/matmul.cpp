#include "kernels/cpu/matmul.h"

#include <algorithm>
#include <atomic>
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

bool cpu_has_avx2() {
  static const bool ok =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
  return ok;
}

std::atomic<isa> g_isa{isa::best};

// range_fn refers to the caller's lambda without copying it, so no call allocates here.
void run(thread_pool* pool, int64_t n, int64_t grain, range_fn body) {
  if (pool)
    pool->parallel_for(n, grain, body);
  else if (n > 0)
    body(0, n);
}

}  // namespace

bool isa_supported(isa which) { return which != isa::avx2 || cpu_has_avx2(); }

void set_isa(isa which) {
  if (!isa_supported(which))
    throw std::invalid_argument(std::string("set_isa: this CPU cannot run the ") + isa_name(which) +
                                " path (needs AVX2, FMA and F16C)");
  g_isa.store(which, std::memory_order_relaxed);
}

isa active_isa() {
  const isa which = g_isa.load(std::memory_order_relaxed);
  if (which != isa::best) return which;
  return cpu_has_avx2() ? isa::avx2 : isa::scalar;
}

const char* isa_name(isa which) {
  switch (which) {
    case isa::scalar: return "scalar";
    case isa::avx2: return "avx2";
    case isa::best: return "best";
  }
  return "unknown";
}

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
  const vec_dot_fn dot = active_isa() == isa::avx2 ? kernel.avx2 : kernel.scalar;
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

  if (n_x == 1) {
    // Decode: one activation row, split over output rows.
    run(pool, rows, std::max<int64_t>(1, k_min_chunk_work / cols), [&](int64_t b, int64_t e) {
      for (int64_t o = b; o < e; ++o) dot(cols, wb + o * w_row, act, a_row, 1, y + o, rows);
    });
    return;
  }

  // Prefill: each chunk of output rows is walked in tiles small enough to stay in cache;
  // every group of k_max_act_rows activation rows passes over the whole tile, and each
  // kernel call decodes a weight row's blocks once for the whole group.
  const int64_t tile = std::clamp<int64_t>(k_tile_weight_bytes / static_cast<int64_t>(w_row), 1, k_max_tile_rows);
  run(pool, rows, std::max<int64_t>(1, k_min_chunk_work / (cols * n_x)), [&](int64_t b, int64_t e) {
    for (int64_t o0 = b; o0 < e; o0 += tile) {
      const int64_t o1 = std::min(e, o0 + tile);
      for (int64_t r0 = 0; r0 < n_x; r0 += k_max_act_rows) {
        const int nr = static_cast<int>(std::min<int64_t>(k_max_act_rows, n_x - r0));
        for (int64_t o = o0; o < o1; ++o) dot(cols, wb + o * w_row, act + r0 * a_row, a_row, nr, y + r0 * rows + o, rows);
      }
    }
  });
}

}  // namespace tandem::kernels::cpu
