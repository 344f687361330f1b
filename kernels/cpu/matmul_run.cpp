// The runners of a product (matmul_impl.h), one per weight layout, each over a range of one
// job's row groups against every activation row, and the requests for a range's first bytes.
#include "kernels/cpu/matmul_impl.h"

#include <xmmintrin.h>

#include <algorithm>

#include "kernels/cpu/packed.h"
#include "kernels/cpu/panel.h"

namespace tandem::kernels::cpu {
namespace {

// Weight bytes one prefill tile keeps hot while every group of activation rows passes over
// it: about half of a typical 48-64 KiB L1d plus 1-2 MiB L2 leaves room for the activations.
constexpr int64_t k_tile_weight_bytes = 32 * 1024;
constexpr int64_t k_max_tile_rows = 64;

// The thread's buffer for one panel: packed per call, or a packed panel expanded.
uint8_t* panel_scratch(size_t bytes) {
  thread_local std::vector<uint8_t> buf;
  return aligned_scratch(buf, bytes);
}

}  // namespace

// The first k_packed_prefetch_ahead bytes into L1, or for the AVX2 packed kernels (packed.h)
// the first k_packed_l1_ahead_avx2 into L1 and the rest up to k_packed_l2_ahead_avx2 into L2:
// the kernels' own requests run that far ahead of their reads. Also for the passes that then
// ask only near ahead (packed.h): the core's stream prefetcher needs a few misses to start,
// and a short piece is over before it runs far ahead (decode 1-2% faster than asking only near
// ahead here too).
void prefetch_groups(const matmul_plan& plan, const matmul_job& job, const matmul_job_plan& p, int64_t g_begin, int64_t g_end) {
  const size_t group_bytes = p.packed ? packed_panel_bytes(job.wt, plan.cols) : p.w_row * k_max_weight_rows;
  const char* first = static_cast<const char*>(job.w) + static_cast<size_t>(g_begin) * group_bytes;
  const size_t run = static_cast<size_t>(g_end - g_begin) * group_bytes;
  const bool two_levels = p.packed && plan.path == isa::avx2;
  const size_t l1 = std::min(run, two_levels ? k_packed_l1_ahead_avx2 : k_packed_prefetch_ahead);
  for (size_t off = 0; off < l1; off += 64) _mm_prefetch(first + off, _MM_HINT_T0);
  if (!two_levels) return;
  for (size_t off = l1, l2 = std::min(run, k_packed_l2_ahead_avx2); off < l2; off += 64) _mm_prefetch(first + off, _MM_HINT_T1);
}

// Packed panels: each group is a panel of k_panel_rows weight rows, run against all
// activation rows on the path's packed kernel (avx512: tiled passes of up to
// k_packed_max_act_rows rows, or from k_expand_min_act_rows rows the panel expanded for the
// panel kernel or the AMX tiles).
void run_packed(const matmul_plan& plan, const matmul_job& job, const matmul_job_plan& p, const matmul_forms& f, int64_t g_begin, int64_t g_end) {
  const int64_t cols = plan.cols, n_x = plan.n_x;
  const int8_t* codes = f.panel_codes[p.panel_slot];
  const float* aux = f.panel_aux[p.panel_slot];
  const auto aux_per_row = static_cast<int64_t>(panel_act_aux_floats(job.wt, cols, 1));
  const size_t pb = packed_panel_bytes(job.wt, cols);
  prefetch_groups(plan, job, p, g_begin, g_end);
  // A batch's outputs are read next by other threads (the following op's parts), so their
  // lines sit in other cores' caches and each group's stores waited for them. The pass asks
  // for them with the right to write (prefetchw) a group ahead of the stores: batched decode
  // of 8 2.4-4.4% faster. Batches only; prompts were not measured.
  const bool ask_own = n_x > 1 && n_x <= k_packed_max_act_rows && cpu_has_prefetchw();
  auto ask_own_group = [&](int64_t g) {
    for (int64_t r = 0; r < n_x; ++r) asm volatile("prefetchw %0" ::"m"(job.y[r * job.rows + g * k_panel_rows]));
  };
  if (ask_own) ask_own_group(g_begin);
  for (int64_t g = g_begin; g < g_end; ++g) {
    const int64_t o = g * k_panel_rows;
    const int n_w = static_cast<int>(std::min<int64_t>(k_panel_rows, job.rows - o));
    const uint8_t* panel = static_cast<const uint8_t*>(job.w) + g * pb;
    if (ask_own && g + 1 < g_end) ask_own_group(g + 1);
    if (plan.path == isa::avx2) {
      packed_dot_avx2(job.wt, panel, cols, codes, aux, static_cast<int>(n_x), job.y + o, job.rows, n_w, job.order);
      continue;
    }
    if (plan.path != isa::avx512) {
      packed_dot_ref(job.wt, panel, cols, codes, aux, static_cast<int>(n_x), job.y + o, job.rows, n_w);
      continue;
    }
    // Q4_1/Q5_1 in the tile's order stay on the packed tile for every row count, as the
    // expanded panel's vector kernel keeps ggml's and a row must not change order with n_x,
    // except on the tile unit, whose epilogue is the packed tile's own.
    const bool tile_order = has_ggml_order(job.wt) && job.order == sum_order::tile;
    if (n_x >= k_expand_min_act_rows && (!tile_order || plan.amx)) {
      uint8_t* wide = panel_scratch(panel_bytes(job.wt, cols));
      expand_packed_avx512(job.wt, panel, cols, wide);
      if (plan.amx && (panel_amx_supported(job.wt) || tile_order)) {
        panel_sign_codes(job.wt, wide, cols);
        panel_dot_amx(job.wt, wide, cols, codes, aux, static_cast<int>(n_x), job.y + o, job.rows, n_w);
        continue;
      }
      for (int64_t r0 = 0; r0 < n_x; r0 += k_panel_max_act_rows) {
        const int nr = static_cast<int>(std::min<int64_t>(k_panel_max_act_rows, n_x - r0));
        panel_dot_avx512(job.wt, wide, cols, codes + r0 * cols, aux + r0 * aux_per_row, nr, job.y + r0 * job.rows + o, job.rows, n_w);
      }
      continue;
    }
    if (has_ggml_order(job.wt) && job.order == sum_order::ggml) {  // reads the rows
      packed_dot_avx512(job.wt, panel, cols, codes, aux, static_cast<int>(n_x), job.y + o, job.rows, n_w, job.order);
      continue;
    }
    if (n_x == 1) {  // one row's tiled form is its panel form
      packed_dot_tiled_avx512(job.wt, panel, cols, codes, aux, 1, job.y + o, job.rows, n_w, job.order);
      continue;
    }
    for (int64_t r0 = 0; r0 < n_x; r0 += k_packed_max_act_rows) {
      const int nr = static_cast<int>(std::min<int64_t>(k_packed_max_act_rows, n_x - r0));
      packed_dot_tiled_avx512(job.wt, panel, cols, f.tiled_codes[p.panel_slot] + r0 * cols, f.tiled_aux[p.panel_slot] + r0 * aux_per_row, nr,
                              job.y + r0 * job.rows + o, job.rows, n_w, job.order);
    }
  }
}

// Panels packed per call (avx512, GGUF rows): each group's k_panel_rows weight rows packed
// once and run against every activation row, k_panel_max_act_rows at a time, or on the AMX
// tiles.
void run_panels(const matmul_plan& plan, const matmul_job& job, const matmul_job_plan& p, const matmul_forms& f, int64_t g_begin, int64_t g_end) {
  const int64_t cols = plan.cols, n_x = plan.n_x;
  uint8_t* panel = panel_scratch(panel_bytes(job.wt, cols));
  const int8_t* codes = f.panel_codes[p.panel_slot];
  const float* aux = f.panel_aux[p.panel_slot];
  const auto aux_per_row = static_cast<int64_t>(panel_act_aux_floats(job.wt, cols, 1));
  for (int64_t g = g_begin; g < g_end; ++g) {
    const int64_t o = g * k_panel_rows;
    const int n_w = static_cast<int>(std::min<int64_t>(k_panel_rows, job.rows - o));
    pack_panel_avx512(job.wt, static_cast<const uint8_t*>(job.w) + o * p.w_row, p.w_row, n_w, cols, panel);
    if (plan.amx && panel_amx_supported(job.wt)) {
      panel_sign_codes(job.wt, panel, cols);
      panel_dot_amx(job.wt, panel, cols, codes, aux, static_cast<int>(n_x), job.y + o, job.rows, n_w);
      continue;
    }
    for (int64_t r0 = 0; r0 < n_x; r0 += k_panel_max_act_rows) {
      const int nr = static_cast<int>(std::min<int64_t>(k_panel_max_act_rows, n_x - r0));
      panel_dot_avx512(job.wt, panel, cols, codes + r0 * cols, aux + r0 * aux_per_row, nr, job.y + r0 * job.rows + o, job.rows, n_w);
    }
  }
}

// Row tiles: decode (one activation row) streams each group's weights once; prefill walks the
// groups in tiles small enough to stay in cache while every group of k_max_act_rows
// activation rows passes over the tile, each kernel call decoding a group of weight rows once
// for the whole activation group.
void run_rows(const matmul_plan& plan, const matmul_job& job, const matmul_job_plan& p, const matmul_forms& f, int64_t g_begin, int64_t g_end) {
  const int64_t cols = plan.cols, n_x = plan.n_x;
  const int64_t rows = job.rows;
  const auto* wb = static_cast<const uint8_t*>(job.w);
  const uint8_t* a = f.act[p.act_slot];
  float* y = job.y;
  auto group_rows = [rows](int64_t o) { return static_cast<int>(std::min<int64_t>(k_max_weight_rows, rows - o)); };
  if (n_x == 1) {
    for (int64_t g = g_begin; g < g_end; ++g) {
      const int64_t o = g * k_max_weight_rows;
      p.dot(cols, wb + o * p.w_row, p.w_row, group_rows(o), a, p.a_row, 1, y + o, rows);
    }
    return;
  }
  const int64_t tile =
      std::clamp<int64_t>(k_tile_weight_bytes / static_cast<int64_t>(p.w_row * k_max_weight_rows), 1, k_max_tile_rows / k_max_weight_rows);
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

}  // namespace tandem::kernels::cpu
