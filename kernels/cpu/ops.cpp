// The element-wise ops of ops.h (RMSNorm, RoPE, softmax, SwiGLU, the KV store, the Hadamard
// rotation of KV heads): the scalar references, and the dispatch to their AVX2 and AVX-512
// forms (ops_simd.h).
#include "kernels/cpu/ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <numbers>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops_simd.h"
#include "kernels/cpu/quants.h"
#include "kernels/cpu/thread_pool.h"

namespace tandem::kernels::cpu {

void rms_norm(const float* x, const float* w, float* out, int64_t n, float eps) {
  if (n <= 0) return;
  if (active_isa() != isa::scalar) return rms_norm_avx2(x, w, out, n, eps);
  // Same arithmetic as ggml's rms_norm + mul: squares in float summed in double, one float
  // scale, then x*scale*w in that order, so hidden states track llama.cpp closely.
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) sum += static_cast<double>(x[i] * x[i]);
  const float mean = static_cast<float>(sum / static_cast<double>(n));
  const float scale = 1.0f / std::sqrt(mean + eps);
  if (w) {
    for (int64_t i = 0; i < n; ++i) out[i] = (x[i] * scale) * w[i];
  } else {
    for (int64_t i = 0; i < n; ++i) out[i] = x[i] * scale;
  }
}

namespace {

// YaRN: the rotary dimension whose wavelength fits `n_rot_turns` full turns into the training
// context (solve n_ctx_orig = n_rot_turns * 2*pi * base^(2d/n_dims) for d).
float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot_turns, float base) {
  return static_cast<float>(n_dims) * std::log(static_cast<float>(n_ctx_orig) / (n_rot_turns * 2.0f * std::numbers::pi_v<float>)) /
         (2.0f * std::log(base));
}

// Pair indices [low, high] between which YaRN blends interpolated and extrapolated angles:
// pairs below `low` rotate fast enough to keep their original frequency (extrapolate), pairs
// above `high` are interpolated by freq_scale.
void yarn_corr_dims(int n_dims, int n_ctx_orig, float base, float beta_fast, float beta_slow, float dims[2]) {
  const float start = std::floor(yarn_corr_dim(n_dims, n_ctx_orig, beta_fast, base));
  const float end = std::ceil(yarn_corr_dim(n_dims, n_ctx_orig, beta_slow, base));
  dims[0] = std::max(0.0f, start);
  dims[1] = std::min(static_cast<float>(n_dims - 1), end);
}

// 1 at and below `low`, 0 at and above `high`, linear in between (pair index i).
float yarn_ramp(float low, float high, int i) {
  const float y = (static_cast<float>(i) - low) / std::max(0.001f, high - low);
  return 1.0f - std::min(1.0f, std::max(0.0f, y));
}

}  // namespace

int rope_table_floats(int head_dim, const rope_params& p) {
  const int n_rot = std::min(p.n_rot > 0 ? p.n_rot : head_dim, head_dim);
  return n_rot / 2 * 2;
}

void rope_table(int64_t pos, int head_dim, const rope_params& p, float* cs) {
  const int n_rot = std::min(p.n_rot > 0 ? p.n_rot : head_dim, head_dim);
  const int half = n_rot / 2;
  float corr[2] = {0.0f, 0.0f};
  float mscale = p.attn_factor;
  const bool yarn = p.ext_factor != 0.0f;
  if (yarn) {
    yarn_corr_dims(n_rot, p.n_ctx_orig, p.freq_base, p.beta_fast, p.beta_slow, corr);
    // YaRN's attention temperature: it scales q and k alike, hence is folded into cos/sin.
    mscale *= 1.0f + 0.1f * std::log(1.0f / p.freq_scale);
  }
  // theta_i = pos * base^(-2i/n_rot), built by repeated multiplication in float exactly as
  // ggml does, so angles at large positions round the same way as llama.cpp's.
  const float theta_scale = std::pow(p.freq_base, -2.0f / static_cast<float>(n_rot));
  float theta = static_cast<float>(pos);
  for (int i = 0; i < half; ++i) {
    const float extrap = p.freq_factors ? theta / p.freq_factors[i] : theta;
    const float interp = p.freq_scale * extrap;
    float angle = interp;
    if (yarn) {
      const float mix = yarn_ramp(corr[0], corr[1], i) * p.ext_factor;
      angle = interp * (1.0f - mix) + extrap * mix;
    }
    cs[2 * i] = std::cos(angle) * mscale;
    cs[2 * i + 1] = std::sin(angle) * mscale;
    theta *= theta_scale;
  }
}

void rope_apply(float* x, int n_heads, int head_dim, const float* cs, const rope_params& p) {
  const int half = rope_table_floats(head_dim, p) / 2;
  if (active_isa() != isa::scalar) return rope_apply_avx2(x, n_heads, head_dim, half, p.pairing == rope_pairing::neox, cs);
  // Pair i of a head: (v[2i], v[2i+1]) when adjacent, (v[i], v[i+half]) when neox. Dimensions
  // from n_rot to head_dim are left untouched.
  const int stride = p.pairing == rope_pairing::adjacent ? 2 : 1;
  const int other = p.pairing == rope_pairing::adjacent ? 1 : half;
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<int64_t>(h) * head_dim;
    for (int i = 0; i < half; ++i) {
      float* a = v + i * stride;
      float* b = a + other;
      const float c = cs[2 * i];
      const float s = cs[2 * i + 1];
      const float x0 = *a;
      const float x1 = *b;
      *a = x0 * c - x1 * s;
      *b = x0 * s + x1 * c;
    }
  }
}

void rope(float* x, int n_heads, int head_dim, int64_t pos, const rope_params& p) {
  const int n = rope_table_floats(head_dim, p);
  if (n == 0) return;
  // Thread-local so that concurrent calls from pool workers neither race nor allocate after
  // the first call.
  thread_local std::vector<float> cs;
  cs.resize(static_cast<size_t>(n));
  rope_table(pos, head_dim, p, cs.data());
  rope_apply(x, n_heads, head_dim, cs.data(), p);
}

void softmax(float* x, int64_t n) {
  if (n <= 0) return;
  if (active_isa() != isa::scalar) return softmax_avx2(x, n);
  float max_v = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) max_v = x[i] > max_v ? x[i] : max_v;
  // Exponentials are F32; their sum is kept in double (as ggml's soft_max does) so long rows
  // (attention over many keys, a whole vocabulary) do not lose the small terms.
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max_v);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

void swiglu(float* gate, const float* up, int64_t n) {
  // silu(g) = g * sigmoid(g), written as g / (1 + e^-g) like ggml: for very negative g,
  // e^-g overflows to inf and the result is a clean -0 instead of inf * 0 = NaN.
  // expf itself: an AVX2 version with the vector e^x avx2::exp_ps (within 2 ulp) flips greedy
  // tokens of the SmolLM2 llama.cpp fixtures (tests/models). The AVX2 and AVX-512 forms give
  // these same bits (avx2::expf_exact, avx512::expf_exact). Large calls (batched decode,
  // prefill) are split over the pool too, and the rows the server computes take swiglu_fast.
  switch (active_isa()) {
    case isa::avx512:
      return swiglu_avx512(gate, up, n);
    case isa::avx2:
      return swiglu_exact_avx2(gate, up, n);
    default:
      break;
  }
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i];
    gate[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void swiglu(float* gate, const float* up, int64_t n, thread_pool* pool) {
  // Below this many elements a wakeup of the workers costs more than the expf calls it saves.
  constexpr int64_t k_min_chunk = 4096;
  if (!pool || n < 2 * k_min_chunk) {
    swiglu(gate, up, n);
    return;
  }
  pool->parallel_for(n, k_min_chunk, [&](int64_t b, int64_t e) { swiglu(gate + b, up + b, e - b); });
}

void swiglu_fast(float* gate, const float* up, int64_t n, thread_pool* pool) {
  if (active_isa() == isa::scalar) return swiglu(gate, up, n, pool);
  // The vector form is several times cheaper per element, so it pays for a wakeup later.
  constexpr int64_t k_min_chunk = 16384;
  if (!pool || n < 2 * k_min_chunk) {
    swiglu_avx2(gate, up, n);
    return;
  }
  pool->parallel_for(n, k_min_chunk, [&](int64_t b, int64_t e) { swiglu_avx2(gate + b, up + b, e - b); });
}

const char* kv_type_name(kv_type t) {
  switch (t) {
    case kv_type::f32:
      return "f32";
    case kv_type::f16:
      return "f16";
    case kv_type::q8_0:
      return "q8_0";
    case kv_type::q4_0:
      return "q4_0";
  }
  return "?";
}

void kv_store(void* cache, kv_type kt, int64_t pos, const float* rows, int64_t n, int64_t row_elems) {
  const int64_t first = pos * row_elems;
  const int64_t count = n * row_elems;
  if (kv_quantized(kt)) {
    if (row_elems % k_kv_quant_block != 0)
      throw std::invalid_argument(std::string("kv_store: a ") + kv_type_name(kt) + " cache needs rows of a multiple of 32 elements, got " +
                                  std::to_string(row_elems));
    const weight_type wt = kt == kv_type::q8_0 ? weight_type::q8_0 : weight_type::q4_0;
    quantize_row(wt, rows, static_cast<char*>(cache) + kv_bytes(kt, first), count);
    return;
  }
  if (kt == kv_type::f32) {
    std::memcpy(static_cast<float*>(cache) + first, rows, static_cast<size_t>(count) * sizeof(float));
    return;
  }
  // Round to nearest even, as ggml's F32 -> F16 copy into the cache does.
  uint16_t* dst = static_cast<uint16_t*>(cache) + first;
  if (active_isa() != isa::scalar) return f32_to_f16_row_avx2(rows, dst, count);
  for (int64_t i = 0; i < count; ++i) dst[i] = fp32_to_fp16(rows[i]);
}

void hadamard_heads(float* x, int64_t n_rows, int64_t row_stride, int n_heads, int head_dim) {
  if (head_dim <= 0 || (head_dim & (head_dim - 1)) != 0)
    throw std::invalid_argument("hadamard_heads: head_dim must be a power of two, got " + std::to_string(head_dim));
  const float norm = 1.0f / std::sqrt(static_cast<float>(head_dim));
  for (int64_t r = 0; r < n_rows; ++r) {
    for (int h = 0; h < n_heads; ++h) {
      float* v = x + r * row_stride + static_cast<int64_t>(h) * head_dim;
      // The fast transform: log2(head_dim) rounds of butterflies (a + b, a - b).
      for (int len = 1; len < head_dim; len <<= 1)
        for (int i = 0; i < head_dim; i += 2 * len)
          for (int j = i; j < i + len; ++j) {
            const float a = v[j], b = v[j + len];
            v[j] = a + b;
            v[j + len] = a - b;
          }
      for (int e = 0; e < head_dim; ++e) v[e] *= norm;
    }
  }
}

}  // namespace tandem::kernels::cpu
