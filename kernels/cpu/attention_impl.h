// Internal to the CPU attention op (attention.cpp): the unit of work its ISA paths share and
// their entry points (attention_avx2.cpp, attention_avx512.cpp, both built from
// attention_simd.h).
//
// Every path computes the same arithmetic as the scalar reference, operation for operation, so
// a forced path and the reference agree bit for bit on an f16 cache (on an f32 cache they
// differ only through softmax's exponentials):
//  - dot products (scores): eight partial sums, element i of the whole 8-element blocks going
//    to sum i % 8 and the remaining elements to sum 0 in order, each product rounded to float
//    before it is added; then ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7)), times scale.
//  - f16 cache: acc = round_f16(acc * ms) when the running max grows, then
//    acc = round_f16(acc + v * w) and S = S * ms + w, products rounded before the add;
//    out = acc * (1 / S).
//  - f32 cache: softmax over all scores, then out += p * v over the keys in order.
//  - exponentials of the online softmax: expf, one per key and head, in every path.
// Products are never fused into the add (the SIMD files build with FMA and keep the compiler
// from contracting), except where fusing cannot change a bit: on an f16 cache a score's
// products are of two f16 values (the query is rounded to f16), exact in float, so the SIMD
// paths score with fused multiply-adds there. ggml's x86 build does fuse its f16 value
// multiply-add, whose products (value times weight) do round: the fused form
// moves logits by float noise only, yet flips greedy tokens of the SmolLM2 llama.cpp fixtures
// (tests/models), whose top two logits sit 0.005 apart at some steps; these keep them.
#pragma once

#include <cstdint>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_pool.h"

namespace tandem::kernels::cpu {

inline constexpr int k_attention_pad = 16;                  // rows are padded to a multiple of this
inline constexpr int k_attention_key_block = 16;            // keys widened and scored per step
inline constexpr int k_attention_task_rows = 8;             // query rows per task on an f16 cache (4: 5% slower a key)
inline constexpr int k_attention_min_units_per_thread = 4;  // else tasks keep one row

// Elements from the task's k (or v) to the row of position p. The f32 and f16 paths carry
// pages.block_stride in elements (attend_runs converts ops.h's bytes once per call).
inline int64_t kv_row_offset(const kv_pages& pg, int64_t kv_stride, int64_t p) {
  if (!pg.table) return p * kv_stride;
  return pg.table[p / pg.block_tokens] * pg.block_stride + (p % pg.block_tokens) * kv_stride;
}

// Query heads of one query row that share one KV head, attended together so that each key and
// value row is read (and widened from f16) once for all of them; on an f16 cache n_rows
// consecutive rows of one sequence go together too, each key block widened once for all their
// heads. A row's arithmetic is the same whatever rows share its task.
struct attention_task {
  const float* q;     // [n_group][head_dim]: consecutive heads of the first query row
  float* out;         // [n_group][head_dim]
  const void* k;      // this KV head's key at position 0 (f32 or f16 elements, per kt)
  const void* v;      // this KV head's value at position 0
  int64_t kv_stride;  // elements from one position to the next (within a block when paged)
  kv_pages pages;     // paged cache: k and v are block 0's rows (ops.h)
  int64_t n_keys;     // the first row attends positions 0 .. n_keys-1, row r n_keys + r of them
  int n_rows = 1;     // query rows, each row_stride floats after the last in q and out
  int64_t row_stride = 0;
  int n_group;  // heads in q / out
  int head_dim;
  int padded_dim;  // head_dim rounded up to a multiple of k_attention_pad
  float scale;     // applied to every dot product
  kv_type kt;
};

// One thread's working memory for a task, carved from one block it owns and reuses. Rows are
// padded_dim floats; padding lanes hold zeros. H is n_rows * n_group (every head of every row)
// for an f16 cache, n_group for f32 (whose rows go one at a time).
struct attention_scratch {
  float* q;       // [H][padded_dim]: the queries (f16-rounded for an f16 cache)
  float* acc;     // [H][padded_dim]: value accumulators
  float* k;       // [k_attention_key_block][padded_dim]: widened key rows
  float* v;       // [k_attention_key_block][padded_dim]: widened value rows
  float* scores;  // [n_group][n_keys of the last row] for an f32 cache, [H][k_attention_key_block] for f16
  float* ms;      // [H][k_attention_key_block]: f16 cache, rescale factor per key
  float* w;       // [H][k_attention_key_block]: f16 cache, value weight per key
  float* m;       // [H]: running max of the online softmax
  float* sum;     // [H]: running sum of the online softmax
};

// Task t's row r alone (n_rows 1): what the paths that take rows one at a time run.
inline attention_task task_row(const attention_task& t, int r) {
  attention_task one = t;
  one.q = t.q + r * t.row_stride;
  one.out = t.out + r * t.row_stride;
  one.n_keys = t.n_keys + r;
  one.n_rows = 1;
  return one;
}

// attention_many (part: null) or one member's part of it on a q8_0 or q4_0 cache
// (attention_quant.cpp): every row alike, f32 arithmetic over dequantized rows.
void attend_quantized(const attention_run* runs, int64_t n_runs, kv_type kt, int n_heads, int n_kv_heads, int head_dim, float scale,
                      thread_pool* pool, const team_part* part);

// Only call these when the CPU supports the path (isa_supported).
void attend_avx2(const attention_task& t, const attention_scratch& s);
void attend_avx512(const attention_task& t, const attention_scratch& s);

// Prompt rows (attention_run::prompt_rows) on AVX-512 and AVX2: consecutive query rows of one
// sequence, n_heads heads of each of n_kv consecutive KV heads, as up to 16 query vectors (8 on
// AVX2: the path's lanes). Lane i attends with KV head i % kv_period of the tile and is query
// vector i / kv_period: row q / n_heads, head q % n_heads of that KV head's group (lanes whose
// KV head is past n_kv, or whose row is past n_rows, are empty). Decode rows fill a tile with
// several KV heads (kv_period 2 or 4), prompt chunks with rows of one (kv_period 1). Not the
// f16 contract above: f32 throughout, scores from fused multiply-adds over the dimensions in
// order, a vectorised exponential, online softmax over blocks of 16 keys (attention_simd.h,
// prompt_kernel). Each lane's result depends on its own row and head only, never on the
// tile's other lanes or on the path.
struct prompt_tile {
  const float* q;        // the tile's first row, its first KV head's first head
  float* out;            // same layout as q
  int64_t q_row_stride;  // floats from one row's queries to the next's
  int n_heads;           // heads per KV head in the tile
  int n_rows;            // n_rows * n_heads * kv_period <= the path's lanes
  int kv_period = 1;     // 1, 2 or 4: lanes per round of KV heads
  int n_kv = 1;          // KV heads in the tile, 1 .. kv_period
  int group = 0;         // heads from one KV head's first to the next's (with n_kv > 1)
  int64_t row0_pos;      // position of the first row
  const void* k;         // the first KV head's key at position 0 (as attention_task)
  const void* v;
  int64_t kv_stride;
  kv_pages pages;
  int head_dim;
  int padded_dim;
  float scale;
  kv_type kt;
};
inline constexpr int k_prompt_max_kv_period = 4;
inline constexpr int k_prompt_lanes = 16;  // AVX-512's, and both paths' keys per block
inline constexpr int k_prompt_lanes_avx2 = 8;
size_t prompt_scratch_floats(int padded_dim);  // for either path
void attend_prompt_avx512(const prompt_tile& t, float* scratch);
void attend_prompt_avx2(const prompt_tile& t, float* scratch);

// Helpers of the prompt kernel (attention_simd.h) over its lanes type V.
// Key row j of the tile's KV heads into the interleaved block: P rows of dp floats at `rows`
// (row h: KV head h, zero rows past the tile's) to dst[e * P + h].
template <int P>
inline void interleave_keys_any(const float* rows, int dp, float* dst) {
  for (int e = 0; e < dp; ++e)
    for (int h = 0; h < P; ++h) dst[static_cast<size_t>(e) * P + h] = rows[static_cast<size_t>(h) * dp + e];
}

// e^x lane-wise, within a few ulp: 2^n * p(r) with x = n ln2 + r, |r| <= ln2 / 2, ln2 in two
// parts; x is clamped to [-87, 88], so n is in [-126, 127]. exp(0) is exactly 1 (the rescale
// of a block that changes nothing). Written once so that every path takes the same steps,
// which a row's equal bits on either path rely on.
template <class V>
inline typename V::vec prompt_exp(typename V::vec x) {
  using vec = typename V::vec;
  x = V::max(V::min(x, V::set1(88.0f)), V::set1(-87.0f));
  const vec n = V::round(V::mul(x, V::set1(1.44269504088896341f)));
  vec r = V::fnmadd(n, V::set1(0.693359375f), x);
  r = V::fnmadd(n, V::set1(-2.12194440e-4f), r);
  vec p = V::set1(1.9875691500e-4f);
  p = V::fmadd(p, r, V::set1(1.3981999507e-3f));
  p = V::fmadd(p, r, V::set1(8.3334519073e-3f));
  p = V::fmadd(p, r, V::set1(4.1665795894e-2f));
  p = V::fmadd(p, r, V::set1(1.6666665459e-1f));
  p = V::fmadd(p, r, V::set1(5.0000001201e-1f));
  p = V::fmadd(p, V::mul(r, r), V::add(r, V::set1(1.0f)));
  return V::scale2(p, n);
}

// body(b, e) over the units [0, units): only one team member's share of them (part), as one
// pool job, or inline.
template <class Body>
void run_units(int64_t units, thread_pool* pool, const team_part* part, const Body& body) {
  if (part) {
    const int64_t b = share_start(units, part->count, part->index), e = share_start(units, part->count, part->index + 1);
    if (b < e) body(b, e);
  } else if (pool && pool->size() > 1 && units > 1) {
    pool->parallel_for(units, 1, body);
  } else {
    body(0, units);
  }
}

}  // namespace tandem::kernels::cpu
