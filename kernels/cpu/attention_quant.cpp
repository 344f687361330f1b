// Attention over a q8_0 or q4_0 KV cache (attention_impl.h, attend_quantized). A task is up to
// k_rows consecutive query rows of one sequence and the query heads of one KV head: each block
// of 16 key and value rows is dequantized once for all of them, then every (row, head) vector
// runs an online softmax over the block in f32. A vector's arithmetic depends on its own row
// only (its keys, blocks from position 0), never on which rows share its task, so a sequence
// gets the same bits however its prompt is chunked or batched.
#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/attention_impl.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quants.h"
#include "kernels/cpu/thread_pool.h"

namespace tandem::kernels::cpu {

namespace {

constexpr int k_rows = 8;                      // query rows per task
constexpr int k_keys = k_attention_key_block;  // keys dequantized per step

// Eight partial sums, as the other paths' dot products, so the compiler can vectorise it
// without reordering a sum.
float dot8(const float* a, const float* b, int n) {
  float acc[8] = {};
  for (int i = 0; i < n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[i + l] * b[i + l];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
}

struct layout {
  weight_type wt;
  int64_t row_bytes;   // one position's row: every KV head
  int64_t head_bytes;  // one KV head's part of it
};

// Byte offset of position p's row.
int64_t row_at(const kv_pages& pg, int64_t row_bytes, int64_t p) {
  if (!pg.table) return p * row_bytes;
  return pg.table[p / pg.block_tokens] * pg.block_stride + (p % pg.block_tokens) * row_bytes;
}

// Rows [r0, r0 + nr) of run `run`, the `group` heads of KV head kvh.
void attend_task(const attention_run& run, const layout& lo, int64_t r0, int nr, int kvh, int group, int n_heads, int head_dim, float scale,
                 std::vector<float>& scratch) {
  const int d = head_dim;
  const int nv = nr * group;
  scratch.resize(static_cast<size_t>(2 * k_keys * d + nv * d + 2 * nv + k_keys));
  float* kb = scratch.data();
  float* vb = kb + k_keys * d;
  float* acc = vb + k_keys * d;
  float* m = acc + static_cast<size_t>(nv) * d;
  float* l = m + nv;
  float* sc = l + nv;
  std::fill(acc, acc + static_cast<size_t>(nv) * d, 0.0f);
  std::fill(m, m + nv, -std::numeric_limits<float>::infinity());
  std::fill(l, l + nv, 0.0f);
  const auto* kc = static_cast<const char*>(run.k_cache) + kvh * lo.head_bytes;
  const auto* vc = static_cast<const char*>(run.v_cache) + kvh * lo.head_bytes;
  auto q_of = [&](int i) { return run.q + ((r0 + i / group) * n_heads + static_cast<int64_t>(kvh) * group + i % group) * d; };
  const int64_t n_keys = run.pos0 + r0 + nr;  // the last row's
  for (int64_t t0 = 0; t0 < n_keys; t0 += k_keys) {
    const int nb = static_cast<int>(std::min<int64_t>(k_keys, n_keys - t0));
    for (int j = 0; j < nb; ++j) {
      const int64_t off = row_at(run.pages, lo.row_bytes, t0 + j);
      dequantize_row(lo.wt, kc + off, kb + static_cast<size_t>(j) * d, d);
      dequantize_row(lo.wt, vc + off, vb + static_cast<size_t>(j) * d, d);
    }
    for (int i = 0; i < nv; ++i) {
      const int64_t seen = std::min<int64_t>(nb, run.pos0 + r0 + i / group + 1 - t0);  // keys of this block the row sees
      if (seen <= 0) continue;
      const float* q = q_of(i);
      float mb = -std::numeric_limits<float>::infinity();
      for (int j = 0; j < seen; ++j) {
        sc[j] = dot8(q, kb + static_cast<size_t>(j) * d, d) * scale;
        mb = std::max(mb, sc[j]);
      }
      const float m_new = std::max(m[i], mb);
      // Nothing finite yet: subtract 0 so the weights are 0 rather than NaN from inf - inf.
      const float base = m_new == -std::numeric_limits<float>::infinity() ? 0.0f : m_new;
      const float alpha = std::exp(m[i] - base);
      float* a = acc + static_cast<size_t>(i) * d;
      for (int e = 0; e < d; ++e) a[e] *= alpha;
      float sum = 0.0f;
      for (int j = 0; j < seen; ++j) {
        const float w = std::exp(sc[j] - base);
        sum += w;
        const float* v = vb + static_cast<size_t>(j) * d;
        for (int e = 0; e < d; ++e) a[e] += w * v[e];
      }
      l[i] = l[i] * alpha + sum;
      m[i] = m_new;
    }
  }
  for (int i = 0; i < nv; ++i) {
    float* out = run.out + (q_of(i) - run.q);
    const float inv = l[i] > 0.0f ? 1.0f / l[i] : 0.0f;
    for (int e = 0; e < d; ++e) out[e] = acc[static_cast<size_t>(i) * d + e] * inv;
  }
}

}  // namespace

void attend_quantized(const attention_run* runs, int64_t n_runs, kv_type kt, int n_heads, int n_kv_heads, int head_dim, float scale,
                      thread_pool* pool, const team_part* part) {
  if (n_kv_heads <= 0 || n_heads % n_kv_heads != 0)
    throw std::invalid_argument("attention: n_heads (" + std::to_string(n_heads) + ") must be a multiple of n_kv_heads (" +
                                std::to_string(n_kv_heads) + ")");
  if (head_dim <= 0 || head_dim % k_kv_quant_block != 0)
    throw std::invalid_argument(std::string("attention: a ") + kv_type_name(kt) + " cache needs head_dim a multiple of 32, got " +
                                std::to_string(head_dim));
  const layout lo{kt == kv_type::q8_0 ? weight_type::q8_0 : weight_type::q4_0, kv_bytes(kt, static_cast<int64_t>(n_kv_heads) * head_dim),
                  kv_bytes(kt, head_dim)};
  const int group = n_heads / n_kv_heads;
  // Units of run i: [first[i], first[i + 1]), (tile of rows, KV head) pairs.
  thread_local std::vector<int64_t> first;
  first.assign(static_cast<size_t>(n_runs + 1), 0);
  for (int64_t i = 0; i < n_runs; ++i) {
    const int64_t tiles = (std::max<int64_t>(runs[i].n_q, 0) + k_rows - 1) / k_rows;
    first[static_cast<size_t>(i + 1)] = first[static_cast<size_t>(i)] + tiles * n_kv_heads;
  }
  const int64_t units = first[static_cast<size_t>(n_runs)];
  if (units == 0) return;
  const int64_t* firsts = first.data();
  auto body = [&](int64_t begin, int64_t end) {
    thread_local std::vector<float> scratch;
    int64_t i = std::upper_bound(firsts, firsts + n_runs + 1, begin) - firsts - 1;
    for (int64_t u = begin; u < end; ++u) {
      while (u >= firsts[i + 1]) ++i;
      const attention_run& run = runs[i];
      const int64_t local = u - firsts[i];
      const int64_t r0 = local / n_kv_heads * k_rows;
      const int kvh = static_cast<int>(local % n_kv_heads);
      attend_task(run, lo, r0, static_cast<int>(std::min<int64_t>(k_rows, run.n_q - r0)), kvh, group, n_heads, head_dim, scale, scratch);
    }
  };
  run_units(units, pool, part, body);
}

}  // namespace tandem::kernels::cpu
