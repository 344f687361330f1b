#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

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

// Eight independent partial sums so the compiler can keep them in one vector register;
// F32 accumulation like ggml's SIMD dot products.
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

struct attention_job {
  const float* q;
  int64_t pos0;
  const void* k_cache;
  const void* v_cache;
  kv_type kt;
  int n_heads;
  int n_kv_heads;
  int head_dim;
  float scale;
  float* out;
};

// One (query row, head) pair: scores over keys 0..pos, softmax, weighted sum of values.
void attend_one(const attention_job& j, int64_t row, int head, std::vector<float>& scores, std::vector<float>& q16) {
  const int64_t pos = j.pos0 + row;
  const int64_t n_keys = pos + 1;  // causal: this row sees itself and everything before it
  const int kv_head = head / (j.n_heads / j.n_kv_heads);
  const int64_t kv_stride = static_cast<int64_t>(j.n_kv_heads) * j.head_dim;  // elements per position
  const int64_t kv_offset = static_cast<int64_t>(kv_head) * j.head_dim;
  const float* q = j.q + (row * j.n_heads + head) * static_cast<int64_t>(j.head_dim);
  float* out = j.out + (row * j.n_heads + head) * static_cast<int64_t>(j.head_dim);
  const int d = j.head_dim;

  scores.resize(static_cast<size_t>(n_keys));
  std::fill(out, out + d, 0.0f);

  if (j.kt == kv_type::f32) {
    const float* k = static_cast<const float*>(j.k_cache) + kv_offset;
    const float* v = static_cast<const float*>(j.v_cache) + kv_offset;
    for (int64_t t = 0; t < n_keys; ++t) scores[t] = dot_f32(q, k + t * kv_stride, d) * j.scale;
    softmax(scores.data(), n_keys);
    for (int64_t t = 0; t < n_keys; ++t) {
      const float p = scores[t];
      const float* vr = v + t * kv_stride;
      for (int e = 0; e < d; ++e) out[e] += p * vr[e];
    }
    return;
  }

  // F16 cache: the same arithmetic as llama.cpp's default CPU attention, which is ggml's
  // flash-attention kernel (llama.cpp enables it on the CPU by default). Matching it keeps our
  // logits within float noise of llama.cpp's on the same model instead of an F16-sized drift:
  //  - Q is rounded to F16 and dotted with the F16 keys, accumulating in F32;
  //  - softmax is online (running max M and sum S), and the weighted sum of values is kept in
  //    an F16 accumulator: rescaled by exp(M_old - M_new) when the max grows, then v * w
  //    added, each step rounded back to F16; the sum is divided by S only at the end.
  const float* tbl = fp16_table();
  const uint16_t* k = static_cast<const uint16_t*>(j.k_cache) + kv_offset;
  const uint16_t* v = static_cast<const uint16_t*>(j.v_cache) + kv_offset;
  q16.resize(static_cast<size_t>(d));
  for (int e = 0; e < d; ++e) q16[e] = round_to_fp16(q[e]);
  float m = -std::numeric_limits<float>::infinity();
  float sum = 0.0f;
  for (int64_t t = 0; t < n_keys; ++t) {
    const float s = dot_f16(q16.data(), k + t * kv_stride, d, tbl) * j.scale;
    float scale_old = 1.0f;  // factor for what is accumulated so far
    float w = 1.0f;          // weight of this value row
    if (s > m) {
      scale_old = std::exp(m - s);  // exp(-inf) = 0 on the first key
      m = s;
      for (int e = 0; e < d; ++e) out[e] = round_to_fp16(out[e] * scale_old);
    } else {
      w = std::exp(s - m);
    }
    const uint16_t* vr = v + t * kv_stride;
    for (int e = 0; e < d; ++e) out[e] = round_to_fp16(out[e] + tbl[vr[e]] * w);
    sum = sum * scale_old + w;
  }
  const float inv = 1.0f / sum;
  for (int e = 0; e < d; ++e) out[e] *= inv;
}

}  // namespace

void attention(const float* q, int64_t n_q, int64_t pos0, const void* k_cache, const void* v_cache, kv_type kt,
               int n_heads, int n_kv_heads, int head_dim, float scale, float* out, thread_pool* pool) {
  if (n_q <= 0 || n_heads <= 0) return;
  const attention_job job{q, pos0, k_cache, v_cache, kt, n_heads, n_kv_heads, head_dim, scale, out};

  // Work items are (row, head) pairs, row-major; each writes its own slice of `out`.
  const int64_t items = n_q * n_heads;
  auto body = [&job, n_heads](int64_t begin, int64_t end) {
    // Scratch per thread, grown to the longest context seen and reused: no allocation per call
    // once warm.
    thread_local std::vector<float> scores;
    thread_local std::vector<float> q16;
    for (int64_t it = begin; it < end; ++it) attend_one(job, it / n_heads, static_cast<int>(it % n_heads), scores, q16);
  };
  if (pool && pool->size() > 1 && items > 1) {
    pool->parallel_for(items, 1, body);
  } else {
    body(0, items);
  }
}

}  // namespace tandem::kernels::cpu
