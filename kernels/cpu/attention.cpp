#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_pool.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/attention_impl.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/quants.h"

namespace tandem::kernels::cpu {

namespace {

// F16 -> F32 for every bit pattern, built once from the one reference conversion. The inner
// loops read cache elements through it instead of calling a conversion function per element.
const float* fp16_table() {
  static const std::vector<float> table = [] {
    std::vector<float> t(65536);
    for (uint32_t h = 0; h < 65536; ++h) t[h] = fp16_to_fp32(static_cast<uint16_t>(h));
    return t;
  }();
  return table.data();
}

float round_to_fp16(float v) { return fp16_to_fp32(fp32_to_fp16(v)); }

// The dot products of attention_impl.h in plain C++: eight partial sums (element i of the
// whole 8-blocks to sum i % 8, the tail to sum 0), each product rounded before it is added.
float dot_f32(const float* a, const float* b, int n) {
  float acc[8] = {};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  for (; i < n; ++i) acc[0] += a[i] * b[i];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

float dot_f16(const float* a, const uint16_t* b, int n, const float* tbl) {
  float acc[8] = {};
  int i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * tbl[b[i + l]];
  for (; i < n; ++i) acc[0] += a[i] * tbl[b[i]];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

// The scalar reference: one head at a time, key by key, exactly as the contract reads. Uses
// s.q (head_dim floats) and s.scores (n_keys floats). This file is built for baseline x86-64,
// which has no FMA instruction, so no multiply-add here is fused.
void attend_scalar_row(const attention_task& t, const attention_scratch& s) {
  const int d = t.head_dim;
  const int64_t n = t.n_keys;
  for (int g = 0; g < t.n_group; ++g) {
    const float* q = t.q + static_cast<int64_t>(g) * d;
    float* out = t.out + static_cast<int64_t>(g) * d;
    std::fill(out, out + d, 0.0f);

    if (t.kt == kv_type::f32) {
      const float* k = static_cast<const float*>(t.k);
      const float* v = static_cast<const float*>(t.v);
      for (int64_t p = 0; p < n; ++p) s.scores[p] = dot_f32(q, k + kv_row_offset(t.pages, t.kv_stride, p), d) * t.scale;
      softmax(s.scores, n);
      for (int64_t p = 0; p < n; ++p) {
        const float w = s.scores[p];
        const float* vr = v + kv_row_offset(t.pages, t.kv_stride, p);
        for (int e = 0; e < d; ++e) out[e] += w * vr[e];
      }
      continue;
    }

    // F16 cache: the same arithmetic as llama.cpp's default CPU attention, which is ggml's
    // flash-attention kernel (llama.cpp enables it on the CPU by default). Matching it keeps our
    // logits within float noise of llama.cpp's on the same model instead of an F16-sized drift:
    //  - Q is rounded to F16 and dotted with the F16 keys, accumulating in F32;
    //  - softmax is online (running max M and sum S), and the weighted sum of values is kept in
    //    an F16 accumulator: rescaled by exp(M_old - M_new) when the max grows, then v * w
    //    added, each step rounded back to F16; the sum is divided by S only at the end.
    const float* tbl = fp16_table();
    const uint16_t* k = static_cast<const uint16_t*>(t.k);
    const uint16_t* v = static_cast<const uint16_t*>(t.v);
    float* q16 = s.q;
    for (int e = 0; e < d; ++e) q16[e] = round_to_fp16(q[e]);
    float m = -std::numeric_limits<float>::infinity();
    float sum = 0.0f;
    for (int64_t p = 0; p < n; ++p) {
      const float sc = dot_f16(q16, k + kv_row_offset(t.pages, t.kv_stride, p), d, tbl) * t.scale;
      float scale_old = 1.0f;  // factor for what is accumulated so far
      float w = 1.0f;          // weight of this value row
      if (sc > m) {
        scale_old = std::exp(m - sc);  // exp(-inf) = 0 on the first key
        m = sc;
        for (int e = 0; e < d; ++e) out[e] = round_to_fp16(out[e] * scale_old);
      } else {
        w = std::exp(sc - m);
      }
      const uint16_t* vr = v + kv_row_offset(t.pages, t.kv_stride, p);
      for (int e = 0; e < d; ++e) out[e] = round_to_fp16(out[e] + tbl[vr[e]] * w);
      sum = sum * scale_old + w;
    }
    const float inv = 1.0f / sum;
    for (int e = 0; e < d; ++e) out[e] *= inv;
  }
}

void attend_scalar(const attention_task& t, const attention_scratch& s) {
  for (int r = 0; r < t.n_rows; ++r) attend_scalar_row(task_row(t, r), s);
}

using attend_fn = void (*)(const attention_task&, const attention_scratch&);

attend_fn select_attend(isa path) {
  switch (path) {
    case isa::avx512:
      return attend_avx512;
    case isa::avx2:
      return attend_avx2;
    default:
      return attend_scalar;
  }
}

// Row of the u-th work unit, alternating from both ends (0, n-1, 1, n-2, ...): rows see more
// keys the later they come, so each contiguous chunk the pool hands a thread gets a similar
// mix of short and long rows.
int64_t zigzag_row(int64_t u, int64_t n_q) { return u % 2 == 0 ? u / 2 : n_q - 1 - u / 2; }

}  // namespace

// Defined here, in baseline code, because both ISA paths' callers size their scratch with it.
size_t prompt_scratch_floats(int padded_dim) {
  // qt, acc: dp x 16 lanes each; kb, vb: 16 keys x dp x k_prompt_max_kv_period each; the K rows
  // of one key being widened (dp x k_prompt_max_kv_period); w; alpha; 16 floats of alignment
  // slack (attention_simd.h, prompt_kernel). The AVX2 tiles (8 lanes, the same key blocks)
  // take less.
  const size_t dp = static_cast<size_t>(padded_dim);
  constexpr size_t L = k_prompt_lanes;
  constexpr size_t P = k_prompt_max_kv_period;
  return dp * L * 2 + 2 * L * dp * P + dp * P + L * L + L + 16;
}

void attention(const float* q, int64_t n_q, int64_t pos0, const void* k_cache, const void* v_cache, kv_type kt, int n_heads, int n_kv_heads,
               int head_dim, float scale, float* out, thread_pool* pool) {
  const attention_run run{q, n_q, pos0, k_cache, v_cache, out};
  attention_many(&run, 1, kt, n_heads, n_kv_heads, head_dim, scale, pool);
}

namespace {

// attention_many, or with part (pool then unused) only that member's share of the tasks.
void attend_runs(const attention_run* runs, int64_t n_runs, kv_type kt, int n_heads, int n_kv_heads, int head_dim, float scale, thread_pool* pool,
                 const team_part* part) {
  if (part && (part->count < 1 || part->index < 0 || part->index >= part->count))
    throw std::invalid_argument("attention: team part " + std::to_string(part->index) + " of " + std::to_string(part->count));
  if (n_runs <= 0 || n_heads <= 0) return;
  for (int64_t i = 0; i < n_runs; ++i)
    if (runs[i].pages.table && (runs[i].pages.block_tokens <= 0 || runs[i].pages.block_tokens % k_attention_key_block != 0))
      throw std::invalid_argument("attention: a paged cache needs blocks of a multiple of " + std::to_string(k_attention_key_block) +
                                  " positions, got " + std::to_string(runs[i].pages.block_tokens));
  if (kv_quantized(kt)) return attend_quantized(runs, n_runs, kt, n_heads, n_kv_heads, head_dim, scale, pool, part);
  const size_t elem = kt == kv_type::f32 ? sizeof(float) : sizeof(uint16_t);
  for (int64_t i = 0; i < n_runs; ++i)
    if (runs[i].pages.table && runs[i].pages.block_stride % static_cast<int64_t>(elem) != 0)
      throw std::invalid_argument("attention: block stride " + std::to_string(runs[i].pages.block_stride) + " bytes is not a whole number of " +
                                  kv_type_name(kt) + " elements");
  // The f32 and f16 paths count offsets in elements (attention_impl.h, kv_row_offset).
  auto pages_of = [&](const attention_run& r) {
    kv_pages pg = r.pages;
    pg.block_stride /= static_cast<int64_t>(elem);
    return pg;
  };
  int64_t total_rows = 0, max_keys = 0;
  for (int64_t i = 0; i < n_runs; ++i) {
    total_rows += std::max<int64_t>(runs[i].n_q, 0);
    max_keys = std::max(max_keys, runs[i].pos0 + runs[i].n_q);
  }
  if (total_rows == 0) return;
  const int group = n_heads / n_kv_heads;
  const int threads = part ? part->count : pool ? pool->size() : 1;
  // A task is (run, rows, KV head, part of its query heads). Heads sharing a KV head stay in
  // one task unless that leaves threads idle (decode of one sequence: one row); then the group
  // is split into `parts` equal parts.
  int parts = 1;
  while (parts < group && total_rows * n_kv_heads * parts < threads) {
    ++parts;
    while (group % parts != 0) ++parts;
  }
  const int per_task = group / parts;
  const int64_t per_row = static_cast<int64_t>(n_kv_heads) * parts;
  // Prompt rows take the prompt kernel where the CPU has AVX-512 or AVX2, in tiles of up to
  // `lanes` query vectors (16 or 8): `p_heads` heads of one KV head (the group, or `lanes` of
  // it) times `p_rows_per_tile` consecutive rows.
  const isa path = active_isa();
  const bool prompt_kernel = path == isa::avx512 || path == isa::avx2;
  const int lanes = path == isa::avx512 ? k_prompt_lanes : k_prompt_lanes_avx2;
  // A KV head's heads are split over more tiles when there are too few tiles to keep the
  // threads busy (decode of one sequence); a lane's arithmetic does not depend on its tile.
  int p_split = (group + lanes - 1) / lanes;
  while (p_split < group && total_rows * n_kv_heads * p_split < threads) ++p_split;
  const int p_heads = (group + p_split - 1) / p_split;
  const int p_parts = (group + p_heads - 1) / p_heads;
  const int64_t p_rows_per_tile = std::max(1, lanes / p_heads);
  auto prompt_rows = [&](const attention_run& r) { return prompt_kernel ? std::clamp<int64_t>(r.prompt_rows, 0, std::max<int64_t>(r.n_q, 0)) : 0; };
  // A run whose prompt rows leave a tile of one KV head mostly empty (a decode row: one row of
  // `group` heads) takes tiles of `kv_period` KV heads instead, all its rows in each, as many
  // as fill the lanes, but never so few tiles that threads would idle.
  int kv_period = 1;
  if (p_parts == 1) {
    while (kv_period * 2 <= k_prompt_max_kv_period && kv_period * 2 * group <= lanes && kv_period < n_kv_heads) kv_period *= 2;
  }
  auto grouped = [&](const attention_run& r) {
    const int64_t rows = prompt_rows(r);
    return kv_period > 1 && rows > 0 && rows * group * kv_period <= lanes;
  };
  if (kv_period > 1) {
    for (;;) {
      int64_t tiles = 0;
      for (int64_t i = 0; i < n_runs; ++i)
        if (grouped(runs[i])) tiles += (n_kv_heads + kv_period - 1) / kv_period;
      if (tiles == 0 || tiles >= threads || kv_period == 1) break;
      kv_period /= 2;
    }
  }
  const int64_t kv_tiles = (n_kv_heads + kv_period - 1) / kv_period;
  auto prompt_units = [&](const attention_run& r) {
    if (grouped(r)) return kv_tiles;
    return (prompt_rows(r) + p_rows_per_tile - 1) / p_rows_per_tile * n_kv_heads * p_parts;
  };
  // The other rows go k_attention_task_rows consecutive rows to a task on an f16 cache, each
  // key block then widened once for all of them (a 512-row prompt widened every block again
  // for every row), unless that would leave fewer than k_attention_min_units_per_thread
  // units per thread.
  auto other_rows = [&](const attention_run& r) { return std::max<int64_t>(r.n_q, 0) - prompt_rows(r); };
  int task_rows = 1;
  if (kt == kv_type::f16) {
    int64_t tiles = 0;
    for (int64_t i = 0; i < n_runs; ++i) tiles += (other_rows(runs[i]) + k_attention_task_rows - 1) / k_attention_task_rows;
    if (tiles * per_row >= int64_t{k_attention_min_units_per_thread} * threads) task_rows = k_attention_task_rows;
  }
  auto other_tiles = [&](const attention_run& r) { return (other_rows(r) + task_rows - 1) / task_rows; };
  // Units of run i: [first[i], first[i + 1]): its prompt tiles, then (rows, KV head, part) for
  // the other rows (a per-thread buffer: no allocation once warm).
  thread_local std::vector<int64_t> first;
  first.assign(static_cast<size_t>(n_runs + 1), 0);
  for (int64_t i = 0; i < n_runs; ++i)
    first[static_cast<size_t>(i + 1)] = first[static_cast<size_t>(i)] + prompt_units(runs[i]) + other_tiles(runs[i]) * per_row;
  const int64_t units = first[static_cast<size_t>(n_runs)];
  const int64_t* firsts = first.data();

  const attend_fn attend = select_attend(path);
  const int dp = (head_dim + k_attention_pad - 1) / k_attention_pad * k_attention_pad;
  const int64_t kv_stride = static_cast<int64_t>(n_kv_heads) * head_dim;
  // Scores of a whole row for an f32 cache (two-pass softmax, rows one at a time), one key
  // block for f16 (every head of every row of the task: attention_scratch's H).
  const int64_t score_len = kt == kv_type::f32 ? max_keys : k_attention_key_block;
  // One decode row on a team: each member takes a contiguous share of the query heads, in runs
  // of heads that share a KV head, instead of a share of whole (KV head, part) tasks. With 9
  // heads on 3 KV heads (SmolLM2) two members had 1 and 2 groups; now 4 and 5 heads, each
  // member widening two KV heads' rows. A head's arithmetic does not depend on which heads
  // share its task, so the bits are the same.
  const bool head_shares = part && n_runs == 1 && total_rows == 1 && prompt_rows(runs[0]) == 0;
  const int64_t head_begin = head_shares ? share_start(n_heads, part->count, part->index) : 0;
  const int64_t head_end = head_shares ? share_start(n_heads, part->count, part->index + 1) : 0;
  const int64_t heads =
      std::max(kt == kv_type::f16 ? int64_t{per_task} * task_rows : int64_t{per_task}, std::min<int64_t>(group, head_end - head_begin));
  const size_t scratch_floats =
      static_cast<size_t>(2 * heads * dp + 2 * k_attention_key_block * dp + heads * (score_len + 2 * k_attention_key_block) + 2 * heads);

  // The task of `n_group` heads from `head` (all of KV head kv_head's, or a run of them) for
  // `n_rows` rows from `row` of a run.
  auto task_of = [&](const attention_run& run, int64_t row, int64_t n_rows, int64_t head, int kv_head, int n_group) {
    const int64_t q_offset = (row * n_heads + head) * head_dim;
    attention_task t;
    t.q = run.q + q_offset;
    t.out = run.out + q_offset;
    t.k = static_cast<const char*>(run.k_cache) + static_cast<size_t>(kv_head) * head_dim * elem;
    t.v = static_cast<const char*>(run.v_cache) + static_cast<size_t>(kv_head) * head_dim * elem;
    t.kv_stride = kv_stride;
    t.pages = pages_of(run);
    t.n_keys = run.pos0 + row + 1;  // causal: this row sees itself and everything before it
    t.n_rows = static_cast<int>(n_rows);
    t.row_stride = static_cast<int64_t>(n_heads) * head_dim;
    t.n_group = n_group;
    t.head_dim = head_dim;
    t.padded_dim = dp;
    t.scale = scale;
    t.kt = kt;
    return t;
  };

  auto body = [&](int64_t begin, int64_t end) {
    // Grown to the largest need seen and reused: no allocation per call once warm.
    thread_local std::vector<float> scratch;
    if (scratch.size() < scratch_floats) scratch.resize(scratch_floats);
    attention_scratch s;
    s.q = scratch.data();
    s.acc = s.q + heads * dp;
    s.k = s.acc + heads * dp;
    s.v = s.k + k_attention_key_block * dp;
    s.scores = s.v + k_attention_key_block * dp;
    s.ms = s.scores + heads * score_len;
    s.w = s.ms + heads * k_attention_key_block;
    s.m = s.w + heads * k_attention_key_block;
    s.sum = s.m + heads;
    if (head_shares) {
      // [begin, end) are heads here: the member's share, a task per KV head it touches.
      for (int64_t h = begin; h < end;) {
        const int kv_head = static_cast<int>(h / group);
        const int64_t run_end = std::min<int64_t>(end, static_cast<int64_t>(kv_head + 1) * group);
        attend(task_of(runs[0], 0, 1, h, kv_head, static_cast<int>(run_end - h)), s);
        h = run_end;
      }
      return;
    }
    // The run of `begin` by binary search, then forward as the units advance.
    int64_t i = std::upper_bound(firsts, firsts + n_runs + 1, begin) - firsts - 1;
    for (int64_t u = begin; u < end; ++u) {
      while (u >= firsts[i + 1]) ++i;
      const attention_run& run = runs[i];
      int64_t local = u - firsts[i];
      const int64_t p_rows = prompt_rows(run), p_units = prompt_units(run);
      if (local < p_units) {
        thread_local std::vector<float> prompt_scratch;
        if (prompt_scratch.size() < prompt_scratch_floats(dp)) prompt_scratch.resize(prompt_scratch_floats(dp));
        prompt_tile pt;
        pt.q_row_stride = static_cast<int64_t>(n_heads) * head_dim;
        pt.kv_stride = kv_stride;
        pt.pages = pages_of(run);
        pt.head_dim = head_dim;
        pt.padded_dim = dp;
        pt.scale = scale;
        pt.kt = kt;
        int64_t r0 = 0, head = 0;
        int kv_head = 0;
        if (grouped(run)) {
          // Tile `local`: every prompt row, all heads of KV heads kv_period * local onwards.
          kv_head = static_cast<int>(local) * kv_period;
          head = static_cast<int64_t>(kv_head) * group;
          pt.n_heads = group;
          pt.n_rows = static_cast<int>(p_rows);
          pt.kv_period = kv_period;
          pt.n_kv = std::min(kv_period, n_kv_heads - kv_head);
          pt.group = group;
        } else {
          const int64_t per_tile = static_cast<int64_t>(n_kv_heads) * p_parts;
          const int64_t tile = zigzag_row(local / per_tile, p_units / per_tile);
          kv_head = static_cast<int>(local % per_tile) / p_parts;
          const int part = static_cast<int>(local % p_parts);
          r0 = tile * p_rows_per_tile;
          head = static_cast<int64_t>(kv_head) * group + part * p_heads;
          pt.n_heads = std::min(p_heads, group - part * p_heads);
          pt.n_rows = static_cast<int>(std::min(p_rows_per_tile, p_rows - r0));
        }
        pt.q = run.q + (r0 * n_heads + head) * head_dim;
        pt.out = run.out + (r0 * n_heads + head) * head_dim;
        pt.row0_pos = run.pos0 + r0;
        pt.k = static_cast<const char*>(run.k_cache) + static_cast<size_t>(kv_head) * head_dim * elem;
        pt.v = static_cast<const char*>(run.v_cache) + static_cast<size_t>(kv_head) * head_dim * elem;
        if (path == isa::avx512)
          attend_prompt_avx512(pt, prompt_scratch.data());
        else
          attend_prompt_avx2(pt, prompt_scratch.data());
        continue;
      }
      local -= p_units;
      const int64_t row = p_rows + zigzag_row(local / per_row, other_tiles(run)) * task_rows;
      const int kv_head = static_cast<int>(local % per_row) / parts;
      const int part = static_cast<int>(local % parts);
      const int64_t head = static_cast<int64_t>(kv_head) * group + part * per_task;
      attend(task_of(run, row, std::min<int64_t>(task_rows, run.n_q - row), head, kv_head, per_task), s);
    }
  };
  if (head_shares) {
    if (head_begin < head_end) body(head_begin, head_end);
  } else {
    run_units(units, pool, part, body);
  }
}

}  // namespace

void attention_many(const attention_run* runs, int64_t n_runs, kv_type kt, int n_heads, int n_kv_heads, int head_dim, float scale,
                    thread_pool* pool) {
  attend_runs(runs, n_runs, kt, n_heads, n_kv_heads, head_dim, scale, pool, nullptr);
}

void attention_many_part(const attention_run* runs, int64_t n_runs, kv_type kt, int n_heads, int n_kv_heads, int head_dim, float scale,
                         team_part part) {
  attend_runs(runs, n_runs, kt, n_heads, n_kv_heads, head_dim, scale, nullptr, &part);
}

}  // namespace tandem::kernels::cpu
