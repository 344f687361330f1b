#include "kernels/cpu/matmul.h"

#include "kernels/op_table.h"

#include <xmmintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cpu/act_quant.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/panel.h"
#include "kernels/cpu/vec_dot.h"
#include "kernels/op_table.h"

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
// Up to this many activation rows, each thread of a pool converts them all for itself (see
// multiply); more, and they are converted once, split over the pool.
constexpr int64_t k_own_forms_max_rows = 16;

// range_fn refers to the caller's lambda without copying it, so no call allocates here.
void run(thread_pool* pool, int64_t n, int64_t grain, range_fn body) {
  if (pool)
    pool->parallel_for(n, grain, body);
  else if (n > 0)
    body(0, n);
}


// A per-thread buffer of at least `bytes` bytes at a 64-byte boundary, reused across calls.
uint8_t* aligned_scratch(std::vector<uint8_t>& buf, size_t bytes) {
  if (buf.size() < bytes + 64) buf.resize(bytes + 64);
  const auto p = reinterpret_cast<uintptr_t>(buf.data());
  return buf.data() + ((64 - p % 64) % 64);
}

}  // namespace

int64_t matmul_chunk_groups(int64_t cols, int64_t n_x, int64_t group_rows) {
  // A group's rows differ by path: counted as k_max_weight_rows rows, panel chunks would be
  // four times too big (a 576 x 576 packed decode product, 36 panels, on one thread).
  return std::max<int64_t>(1, k_min_chunk_work / std::max<int64_t>(1, cols * n_x * std::max<int64_t>(1, group_rows)));
}

void matmul(weight_type wt, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n_x, float* y,
            thread_pool* pool, weight_layout layout, sum_order order) {
  const matmul_job job{wt, w, rows, y, layout, order};
  matmul_many(&job, 1, cols, x, n_x, pool);
}

namespace {

// What a gated call applies to each chunk's rows once both products are in (matmul_swiglu).
enum class epilogue { none, swiglu_expf, swiglu_vector };

// With part: only that member's share, on this thread (pool is then null).
row_span multiply(const matmul_job* jobs, int n_jobs, int64_t cols, const float* x, int64_t n_x, thread_pool* pool,
                  epilogue gate, const team_part* part = nullptr) {
  if (part && (part->count < 1 || part->index < 0 || part->index >= part->count))
    throw std::invalid_argument("matmul: team part " + std::to_string(part->index) + " of " + std::to_string(part->count));
  if (n_jobs < 0 || n_jobs > k_max_matmul_jobs)
    throw std::invalid_argument("matmul: " + std::to_string(n_jobs) + " jobs, at most " + std::to_string(k_max_matmul_jobs));
  if (cols < 0 || n_x < 0)
    throw std::invalid_argument("matmul: negative shape (cols " + std::to_string(cols) + ", n_x " + std::to_string(n_x) + ")");

  // Per job: kernel, row sizes, and where its row groups start in the joint numbering.
  struct plan {
    const dot_kernel* kernel;
    dot_fn dot;
    size_t w_row, a_row;
    int act_slot;    // which converted copy of x it reads
    bool packed;     // the weights are packed panels (packed.h)
    bool panel;      // panels of k_panel_rows rows, packed per call, instead of row tiles
    int panel_slot;  // which panel form of that copy (panel path only)
    int64_t first_group, groups;
  };
  plan plans[k_max_matmul_jobs];
  weight_type act_types[k_max_matmul_jobs];
  size_t act_offsets[k_max_matmul_jobs + 1] = {0};
  int n_act_types = 0;
  int64_t total_groups = 0;
  const isa path = active_isa();
  // Products over expanded or per-call panels take the AMX tile unit where it is present (same bits).
  const bool amx = path == isa::avx512 && amx_active();
  // Many activation rows against quantized weights: packed panels of 16 rows (panel.h).
  const bool panel_path = path == isa::avx512;
  // Panel forms of the activations, one per distinct (activation type, sub-block size).
  weight_type panel_types[k_max_matmul_jobs];
  int n_panel_slots = 0;
  for (int j = 0; j < n_jobs; ++j) {
    const matmul_job& job = jobs[j];
    if (job.rows < 0) throw std::invalid_argument("matmul: negative shape (rows " + std::to_string(job.rows) + ")");
    // The dispatch table decides what is supported (the same message as the CUDA path).
    require(device_kind::cpu, n_x <= 1 ? op::matvec : op::matmul, job.wt, "matmul");
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
    p.packed = job.layout == weight_layout::packed;
    if (p.packed && !packable(job.wt))
      throw std::invalid_argument("matmul: " + display_name(job.wt) + " weights have no packed layout");
    p.panel = p.packed || (panel_path && panel_supported(job.wt) && n_x >= panel_min_act_rows(job.wt));
    p.panel_slot = 0;
    if (p.panel) {
      // The offset term panel_acts writes depends on the weight type (Q4_0 8, Q8_0 128, ...):
      // a Q8_0 job reading a Q4_0 job's form would start every integer dot wrong.
      auto same_form = [&](weight_type o) {
        return activation_type(o) == kernel.act && panel_sub_elems(o) == panel_sub_elems(job.wt) &&
               panel_code_offset(o) == panel_code_offset(job.wt);
      };
      while (p.panel_slot < n_panel_slots && !same_form(panel_types[p.panel_slot])) ++p.panel_slot;
      if (p.panel_slot == n_panel_slots) panel_types[n_panel_slots++] = job.wt;
    }
    p.first_group = total_groups;
    const int64_t group_rows = p.panel ? k_panel_rows : k_max_weight_rows;
    p.groups = (job.rows + group_rows - 1) / group_rows;
    total_groups += p.groups;
  }
  if (n_x == 0 || total_groups == 0) return {};
  if (cols == 0) {
    // A part zeroes its share of the first job's rows and all of the others' when it is the
    // first (nothing reads them before the team syncs).
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
  // A gated call numbers row groups once for both matrices: group g is the gate's group g and
  // the up's, so every chunk holds both products of its rows when the activation runs. That
  // needs both to cut rows alike; a gate and up on different paths (one packed, one not) run
  // as two products and a separate pass instead.
  const bool paired = gate != epilogue::none && plans[0].groups == plans[1].groups && plans[0].panel == plans[1].panel;
  if (paired) {
    plans[1].first_group = 0;
    total_groups = plans[0].groups;
  }

  // Whether a packed job reads its activations in the tiled form (tile_packed_acts): the
  // AVX-512 tile kernel with several rows and no expansion.
  auto tiled_job = [&](const matmul_job& job) {
    const bool tile_order = has_ggml_order(job.wt) && job.order == sum_order::tile;
    return job.layout == weight_layout::packed && path == isa::avx512 && n_x > 1 &&
           (!has_ggml_order(job.wt) || tile_order) && (n_x < k_expand_min_act_rows || (tile_order && !amx));
  };
  bool tiled_slot[k_max_matmul_jobs] = {};
  // Whether some job reads a slot's panel form row by row (panel_acts' layout); where none
  // does, the rows go straight into the tiled form.
  bool row_panel[k_max_matmul_jobs] = {};
  for (int j = 0; j < n_jobs; ++j) {
    if (tiled_job(jobs[j])) tiled_slot[plans[j].panel_slot] = true;
    else if (plans[j].panel) row_panel[plans[j].panel_slot] = true;
  }
  // On AVX-512 the panel forms come straight from x (panel_act_row: one pass instead of the
  // quantizer's and panel_acts'), so an activation type is converted to its row form only for
  // the jobs that read rows.
  const bool panels_from_x = path == isa::avx512;
  bool row_form[k_max_matmul_jobs] = {};
  for (int j = 0; j < n_jobs; ++j)
    if (!panels_from_x || !plans[j].panel) row_form[plans[j].act_slot] = true;
  bool any_convert = false;
  for (int k = 0; k < n_act_types; ++k) any_convert = any_convert || (act_types[k] != weight_type::f32 && row_form[k]);
  const size_t code_bytes = (panel_act_code_bytes(cols, n_x) + 63) / 64 * 64;
  auto aux_bytes = [&](int k) { return (panel_act_aux_floats(panel_types[k], cols, n_x) * sizeof(float) + 63) / 64 * 64; };
  size_t panel_total = 0;
  for (int k = 0; k < n_panel_slots; ++k) panel_total += (code_bytes + aux_bytes(k)) * (tiled_slot[k] ? 2 : 1);

  // The activations as the kernels read them: each row converted once per activation type
  // (F32 read in place), and per panel slot the int8 codes with {da, da * sum, offset term}
  // per sub-block, plus the tiled form where a packed job reads it (groups of
  // k_packed_max_act_rows rows).
  struct forms {
    const uint8_t* act[k_max_matmul_jobs] = {};
    int8_t* panel_codes[k_max_matmul_jobs] = {};
    float* panel_aux[k_max_matmul_jobs] = {};
    int8_t* tiled_codes[k_max_matmul_jobs] = {};
    float* tiled_aux[k_max_matmul_jobs] = {};
  };
  // Bytes of one set of forms: the converted rows, then (at a 64-byte boundary) the panel forms.
  const size_t act_total = (act_offsets[n_act_types] + 63) / 64 * 64;
  const size_t forms_bytes = act_total + panel_total;
  // Lays f out at `at` (64-byte aligned, forms_bytes long) and converts every row into it,
  // split over `on` (null: on this thread).
  auto prepare = [&](uint8_t* at, forms& f, thread_pool* on) {
    uint8_t* const act_base = at;
    for (int k = 0; k < n_act_types; ++k)
      f.act[k] = act_types[k] == weight_type::f32 ? reinterpret_cast<const uint8_t*>(x) : act_base + act_offsets[k];
    if (n_panel_slots > 0) {
      uint8_t* base = at + act_total;
      for (int k = 0; k < n_panel_slots; ++k) {
        f.panel_codes[k] = reinterpret_cast<int8_t*>(base);
        f.panel_aux[k] = reinterpret_cast<float*>(base + code_bytes);
        base += code_bytes + aux_bytes(k);
        if (tiled_slot[k]) {
          f.tiled_codes[k] = reinterpret_cast<int8_t*>(base);
          f.tiled_aux[k] = reinterpret_cast<float*>(base + code_bytes);
          base += code_bytes + aux_bytes(k);
        }
      }
    }
    if (any_convert) {
      run(on, n_x * n_act_types, std::max<int64_t>(1, k_min_chunk_convert / cols), [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) {
          const auto k = static_cast<int>(i / n_x);
          const int64_t r = i % n_x;
          if (act_types[k] == weight_type::f32 || !row_form[k]) continue;
          const size_t a_row = static_cast<size_t>(row_bytes(act_types[k], cols));
          quantize_activation_row(act_types[k], x + r * cols, act_base + act_offsets[k] + r * a_row, cols);
        }
      });
    }
    if (n_panel_slots == 0) return;
    run(on, n_x * n_panel_slots, std::max<int64_t>(1, k_min_chunk_convert / cols), [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) {
        const auto k = static_cast<int>(i / n_x);
        const int64_t r = i % n_x;
        const weight_type wt = panel_types[k];
        const int64_t aux_per_row = static_cast<int64_t>(panel_act_aux_floats(wt, cols, 1));
        // Group g starts after g full groups, as if its rows lay one after another.
        const int64_t g0 = r / k_packed_max_act_rows * k_packed_max_act_rows;
        const int n_group = static_cast<int>(std::min<int64_t>(k_packed_max_act_rows, n_x - g0));
        if (panels_from_x && tiled_slot[k] && !row_panel[k]) {
          tiled_act_row(wt, x + r * cols, cols, static_cast<int>(r - g0), n_group, f.tiled_codes[k] + g0 * cols,
                        f.tiled_aux[k] + g0 * aux_per_row);
          continue;
        }
        if (panels_from_x) {
          panel_act_row(wt, x + r * cols, cols, f.panel_codes[k] + r * cols, f.panel_aux[k] + r * aux_per_row);
        } else {
          int slot = 0;
          while (act_types[slot] != activation_type(wt)) ++slot;
          const size_t a_row = static_cast<size_t>(row_bytes(act_types[slot], cols));
          panel_acts(wt, f.act[slot] + r * a_row, a_row, 1, cols, f.panel_codes[k] + r * cols, f.panel_aux[k] + r * aux_per_row);
        }
        if (tiled_slot[k]) {
          tile_packed_act_row(wt, cols, f.panel_codes[k] + r * cols, f.panel_aux[k] + r * aux_per_row, static_cast<int>(r - g0),
                              n_group, f.tiled_codes[k] + g0 * cols, f.tiled_aux[k] + g0 * aux_per_row);
        }
      }
    });
  };

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
  uint8_t* const base = aligned_scratch(buf, forms_bytes * sets);
  std::atomic<size_t> next_set{1};
  forms shared;
  if (!part && !own_forms && !shared_in_job) prepare(base, shared, pool);
  const std::thread::id caller = std::this_thread::get_id();
  std::atomic<bool> converted{false};  // the caller has converted (which cannot throw: no allocation)
  static std::atomic<uint64_t> calls{0};
  const uint64_t call = own_forms ? calls.fetch_add(1, std::memory_order_relaxed) + 1 : 0;  // tells a thread's forms stale
  // Asks at once for the start of job j's groups [g_begin, g_end) that the kernels' own
  // requests, which run that far ahead of their reads, would leave to demand misses: the first
  // k_packed_prefetch_ahead bytes into L1, or for the AVX2 packed kernels (packed.h) the first
  // k_packed_l1_ahead_avx2 into L1 and the rest up to k_packed_l2_ahead_avx2 into L2. Also for
  // the passes that then ask only near ahead (packed.h): the core's stream prefetcher needs a
  // few misses to start, and a short piece is over before it runs far ahead (decode 1-2%
  // faster than asking only near ahead here too).
  auto prefetch_groups = [&](int j, int64_t g_begin, int64_t g_end) {
    const plan& p = plans[j];
    const size_t group_bytes = p.packed ? packed_panel_bytes(jobs[j].wt, cols) : p.w_row * k_max_weight_rows;
    const char* first = static_cast<const char*>(jobs[j].w) + static_cast<size_t>(g_begin) * group_bytes;
    const size_t run = static_cast<size_t>(g_end - g_begin) * group_bytes;
    const bool two_levels = p.packed && path == isa::avx2;
    const size_t l1 = std::min(run, two_levels ? k_packed_l1_ahead_avx2 : k_packed_prefetch_ahead);
    for (size_t off = 0; off < l1; off += 64) _mm_prefetch(first + off, _MM_HINT_T0);
    if (!two_levels) return;
    for (size_t off = l1, l2 = std::min(run, k_packed_l2_ahead_avx2); off < l2; off += 64) _mm_prefetch(first + off, _MM_HINT_T1);
  };
  // The same for the start of chunk [b, e): its first job's part.
  auto prefetch_start = [&](int64_t b, int64_t e) {
    for (int j = 0; j < n_jobs; ++j) {
      const int64_t g_begin = std::max(b, plans[j].first_group) - plans[j].first_group;
      const int64_t g_end = std::min(e, plans[j].first_group + plans[j].groups) - plans[j].first_group;
      if (g_begin < g_end) return prefetch_groups(j, g_begin, g_end);
    }
  };

  // Row groups [b, e) of the joint numbering, job by job. Decode (one activation row)
  // streams each group's weights once; prefill walks each job's part in tiles small enough to
  // stay in cache while every group of k_max_act_rows activation rows passes over the tile,
  // each kernel call decoding a group of weight rows once for the whole activation group.
  // Panel jobs: each group is a panel of k_panel_rows weight rows, packed once and then run
  // against every activation row, k_panel_max_act_rows at a time (packed panels:
  // k_packed_max_act_rows).
  auto body = [&](int64_t b, int64_t e) {
    const forms* fp = &shared;
    if (shared_in_job && !converted.load(std::memory_order_acquire)) {
      prefetch_start(b, e);
      if (std::this_thread::get_id() == caller) {
        prepare(base, shared, nullptr);
        converted.store(true, std::memory_order_release);
      } else {
        while (!converted.load(std::memory_order_acquire)) _mm_pause();
      }
    }
    if (own_forms) {
      thread_local forms own;
      thread_local uint64_t own_call = 0;
      if (own_call != call) {
        prefetch_start(b, e);
        const size_t set = std::this_thread::get_id() == caller ? 0 : next_set.fetch_add(1, std::memory_order_relaxed);
        prepare(base + set * forms_bytes, own, nullptr);
        own_call = call;
      }
      fp = &own;
    }
    const forms& f = *fp;
    thread_local std::vector<uint8_t> panel_scratch;
    for (int j = 0; j < n_jobs; ++j) {
      const plan& p = plans[j];
      const int64_t g_begin = std::max(b, p.first_group) - p.first_group;
      const int64_t g_end = std::min(e, p.first_group + p.groups) - p.first_group;
      if (g_begin >= g_end) continue;
      if (p.packed) {
        const matmul_job& job = jobs[j];
        const int8_t* codes = f.panel_codes[p.panel_slot];
        const float* aux = f.panel_aux[p.panel_slot];
        const auto aux_per_row = static_cast<int64_t>(panel_act_aux_floats(job.wt, cols, 1));
        const size_t pb = packed_panel_bytes(job.wt, cols);
        prefetch_groups(j, g_begin, g_end);
        // A batch's outputs are read next by other threads (the following op's parts), so
        // their lines sit in other cores' caches and each group's stores waited for them. The
        // pass asks for them with the right to write (prefetchw) a group ahead of the stores:
        // batched decode of 8 2.4-4.4% faster. Batches only; prompts were not measured.
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
          if (path == isa::avx2) {
            packed_dot_avx2(job.wt, panel, cols, codes, aux, static_cast<int>(n_x), job.y + o, job.rows, n_w, job.order);
            continue;
          }
          if (path != isa::avx512) {
            packed_dot_ref(job.wt, panel, cols, codes, aux, static_cast<int>(n_x), job.y + o, job.rows, n_w);
            continue;
          }
          // Q4_1/Q5_1 in the tile's order stay on the packed tile for every row count, as
          // the expanded panel's vector kernel keeps ggml's and a row must not change order
          // with n_x, except on the tile unit, whose epilogue is the packed tile's own.
          const bool tile_order = has_ggml_order(job.wt) && job.order == sum_order::tile;
          if (n_x >= k_expand_min_act_rows && (!tile_order || amx)) {
            uint8_t* wide = aligned_scratch(panel_scratch, panel_bytes(job.wt, cols));
            expand_packed_avx512(job.wt, panel, cols, wide);
            if (amx && (panel_amx_supported(job.wt) || tile_order)) {
              panel_sign_codes(job.wt, wide, cols);
              panel_dot_amx(job.wt, wide, cols, codes, aux, static_cast<int>(n_x), job.y + o, job.rows, n_w);
              continue;
            }
            for (int64_t r0 = 0; r0 < n_x; r0 += k_panel_max_act_rows) {
              const int nr = static_cast<int>(std::min<int64_t>(k_panel_max_act_rows, n_x - r0));
              panel_dot_avx512(job.wt, wide, cols, codes + r0 * cols, aux + r0 * aux_per_row, nr,
                               job.y + r0 * job.rows + o, job.rows, n_w);
            }
            continue;
          }
          if (has_ggml_order(job.wt) && job.order == sum_order::ggml) {  // reads the rows
            packed_dot_avx512(job.wt, panel, cols, codes, aux, static_cast<int>(n_x), job.y + o, job.rows, n_w, true, job.order);
            continue;
          }
          if (n_x == 1) {  // one row's tiled form is its panel form
            packed_dot_tiled_avx512(job.wt, panel, cols, codes, aux, 1, job.y + o, job.rows, n_w, true, job.order);
            continue;
          }
          for (int64_t r0 = 0; r0 < n_x; r0 += k_packed_max_act_rows) {
            const int nr = static_cast<int>(std::min<int64_t>(k_packed_max_act_rows, n_x - r0));
            packed_dot_tiled_avx512(job.wt, panel, cols, f.tiled_codes[p.panel_slot] + r0 * cols,
                                    f.tiled_aux[p.panel_slot] + r0 * aux_per_row, nr, job.y + r0 * job.rows + o, job.rows,
                                    n_w, true, job.order);
          }
        }
        continue;
      }
      if (p.panel) {
        const matmul_job& job = jobs[j];
        uint8_t* panel = aligned_scratch(panel_scratch, panel_bytes(job.wt, cols));
        const int8_t* codes = f.panel_codes[p.panel_slot];
        const float* aux = f.panel_aux[p.panel_slot];
        const auto aux_per_row = static_cast<int64_t>(panel_act_aux_floats(job.wt, cols, 1));
        for (int64_t g = g_begin; g < g_end; ++g) {
          const int64_t o = g * k_panel_rows;
          const int n_w = static_cast<int>(std::min<int64_t>(k_panel_rows, job.rows - o));
          pack_panel_avx512(job.wt, static_cast<const uint8_t*>(job.w) + o * p.w_row, p.w_row, n_w, cols, panel);
          if (amx && panel_amx_supported(job.wt)) {
            panel_sign_codes(job.wt, panel, cols);
            panel_dot_amx(job.wt, panel, cols, codes, aux, static_cast<int>(n_x), job.y + o, job.rows, n_w);
            continue;
          }
          for (int64_t r0 = 0; r0 < n_x; r0 += k_panel_max_act_rows) {
            const int nr = static_cast<int>(std::min<int64_t>(k_panel_max_act_rows, n_x - r0));
            panel_dot_avx512(job.wt, panel, cols, codes + r0 * cols, aux + r0 * aux_per_row, nr,
                             job.y + r0 * job.rows + o, job.rows, n_w);
          }
        }
        continue;
      }
      const int64_t rows = jobs[j].rows;
      const auto* wb = static_cast<const uint8_t*>(jobs[j].w);
      const uint8_t* a = f.act[p.act_slot];
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
    if (paired) {
      // The chunk's rows of both products are still in cache: gate = silu(gate) * up.
      const int64_t rows = jobs[0].rows, group_rows = plans[0].panel ? k_panel_rows : k_max_weight_rows;
      const int64_t o0 = b * group_rows, o1 = std::min(e * group_rows, rows);
      for (int64_t r = 0; r < n_x; ++r) {
        float* g = jobs[0].y + r * rows + o0;
        const float* u = jobs[1].y + r * rows + o0;
        if (gate == epilogue::swiglu_expf)
          swiglu(g, u, o1 - o0);
        else
          swiglu_fast(g, u, o1 - o0, nullptr);
      }
    }
  };
  if (part) {
    if (gate != epilogue::none && !paired) {
      // Gate and up cut rows differently (16 or 4 a group): the share is whole units of
      // k_panel_rows rows, a whole number of groups of either, so both products of its rows
      // are here for the activation.
      const int64_t rows = jobs[0].rows, units = (rows + k_panel_rows - 1) / k_panel_rows;
      const int64_t r0 = std::min(rows, share_start(units, part->count, part->index) * k_panel_rows);
      const int64_t r1 = std::min(rows, share_start(units, part->count, part->index + 1) * k_panel_rows);
      if (r0 >= r1) return {r0, r0};
      auto groups_of = [&](int j) {
        const int64_t gr = plans[j].panel ? k_panel_rows : k_max_weight_rows;
        return std::pair{plans[j].first_group + r0 / gr, plans[j].first_group + (r1 + gr - 1) / gr};
      };
      prefetch_start(groups_of(0).first, groups_of(0).second);
      prepare(base, shared, nullptr);
      for (int j = 0; j < 2; ++j) body(groups_of(j).first, groups_of(j).second);
      for (int64_t r = 0; r < n_x; ++r) {
        if (gate == epilogue::swiglu_expf)
          swiglu(jobs[0].y + r * rows + r0, jobs[1].y + r * rows + r0, r1 - r0);
        else
          swiglu_fast(jobs[0].y + r * rows + r0, jobs[1].y + r * rows + r0, r1 - r0, nullptr);
      }
      return {r0, r1};
    }
    const int64_t b = share_start(total_groups, part->count, part->index);
    const int64_t e = share_start(total_groups, part->count, part->index + 1);
    if (b < e) {
      prefetch_start(b, e);
      prepare(base, shared, nullptr);
      body(b, e);
    }
    const int64_t gr = plans[0].panel ? k_panel_rows : k_max_weight_rows;
    const int64_t g0 = std::clamp<int64_t>(b, 0, plans[0].groups), g1 = std::clamp<int64_t>(e, 0, plans[0].groups);
    return {std::min(g0 * gr, jobs[0].rows), std::min(g1 * gr, jobs[0].rows)};
  }
  // Rows per group over the whole call: 16 on the panel paths, 4 on the row kernels, between
  // them when one call mixes the two.
  int64_t total_rows = 0;
  for (int j = 0; j < n_jobs; ++j) total_rows += jobs[j].rows;
  run(pool, total_groups, matmul_chunk_groups(cols, n_x, std::max<int64_t>(1, total_rows / total_groups)), body);
  if (gate != epilogue::none && !paired) {
    if (gate == epilogue::swiglu_expf)
      swiglu(jobs[0].y, jobs[1].y, jobs[0].rows * n_x, pool);
    else
      swiglu_fast(jobs[0].y, jobs[1].y, jobs[0].rows * n_x, pool);
  }
  return {0, jobs[0].rows};
}

}  // namespace

void matmul_many(const matmul_job* jobs, int n_jobs, int64_t cols, const float* x, int64_t n_x, thread_pool* pool) {
  multiply(jobs, n_jobs, cols, x, n_x, pool, epilogue::none);
}

void matmul_swiglu(const matmul_job& gate, const matmul_job& up, int64_t cols, const float* x, int64_t n_x,
                   thread_pool* pool, swiglu_exp exp) {
  if (gate.rows != up.rows)
    throw std::invalid_argument("matmul_swiglu: gate has " + std::to_string(gate.rows) + " rows, up " + std::to_string(up.rows));
  const matmul_job jobs[2] = {gate, up};
  multiply(jobs, 2, cols, x, n_x, pool, exp == swiglu_exp::expf ? epilogue::swiglu_expf : epilogue::swiglu_vector);
}

row_span matmul_many_part(const matmul_job* jobs, int n_jobs, int64_t cols, const float* x, int64_t n_x, team_part part) {
  return multiply(jobs, n_jobs, cols, x, n_x, nullptr, epilogue::none, &part);
}

row_span matmul_swiglu_part(const matmul_job& gate, const matmul_job& up, int64_t cols, const float* x, int64_t n_x,
                            team_part part, swiglu_exp exp) {
  if (gate.rows != up.rows)
    throw std::invalid_argument("matmul_swiglu: gate has " + std::to_string(gate.rows) + " rows, up " + std::to_string(up.rows));
  const matmul_job jobs[2] = {gate, up};
  return multiply(jobs, 2, cols, x, n_x, nullptr, exp == swiglu_exp::expf ? epilogue::swiglu_expf : epilogue::swiglu_vector,
                  &part);
}

}  // namespace tandem::kernels::cpu
