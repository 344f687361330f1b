// The prompt-row attention kernel (attention_impl.h, prompt_tile) with AVX-512: the query
// vectors of a tile sit in the 16 lanes of a register, so a key's scores for all of them are
// one chain of fused multiply-adds with the key's elements broadcast, the online softmax runs
// lane-wise with a vectorised exponential, and each value row is folded into the accumulators
// of every query vector of the tile. Keys and values are widened once per tile, not per row.
// With several KV heads in a tile (decode rows: one row has too few heads of one KV head to
// fill the lanes) the widened keys are interleaved, element e of every KV head side by side,
// so one 2- or 4-float broadcast hands each lane its own KV head's element.
//
// Every lane's arithmetic depends on its own row alone, never on which rows share the tile or
// how far the tile's keys reach: keys a row cannot see get a weight of exactly zero, blocks
// past its last key rescale by exactly one. So a prompt row gets the same result bit for bit
// however the prompt is chunked.
// GCC 12 warns, wrongly, that the undefined pass-through operand of the unmasked AVX-512
// intrinsics (cvtph_ps, max_ps, min_ps) may be used uninitialised.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/attention_impl.h"

namespace tandem::kernels::cpu {
namespace {

constexpr int L = 16;  // lanes: query vectors per tile

// e^x lane-wise, within a few ulp: 2^n * p(r) with x = n ln2 + r, |r| <= ln2 / 2. exp(0) is
// exactly 1 (the rescale of a block that changes nothing).
inline __m512 exp_ps(__m512 x) {
  x = _mm512_max_ps(_mm512_min_ps(x, _mm512_set1_ps(88.0f)), _mm512_set1_ps(-87.0f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  return _mm512_scalef_ps(p, n);
}

// Row `p` of KV head `h` of the tile from a cache (f16 or f32) as head_dim floats, zero to dp.
inline void widen(const prompt_tile& t, const void* base, int64_t p, int h, float* dst) {
  const int64_t off = kv_row_offset(t.pages, t.kv_stride, p) + static_cast<int64_t>(h) * t.head_dim;
  const int d = t.head_dim;
  if (t.kt == kv_type::f32) {
    std::memcpy(dst, static_cast<const float*>(base) + off, static_cast<size_t>(d) * sizeof(float));
  } else {
    const auto* src = static_cast<const uint16_t*>(base) + off;
    int i = 0;
    for (; i + 16 <= d; i += 16)
      _mm512_storeu_ps(dst + i, _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i))));
    for (; i < d; ++i) dst[i] = _cvtsh_ss(src[i]);
  }
  for (int i = d; i < t.padded_dim; ++i) dst[i] = 0.0f;
}

// Element e of P KV heads' keys (interleaved: x[h] is KV head h's), repeated across the lanes
// so that lane i holds KV head i % P's.
template <int P>
inline __m512 key_lanes(const float* x) {
  if constexpr (P == 1) return _mm512_set1_ps(x[0]);
  // Two floats through loadl_epi64, whose pointer type may alias them (a double load may not).
  else if constexpr (P == 2) return _mm512_broadcast_f32x2(_mm_castsi128_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(x))));
  else return _mm512_broadcast_f32x4(_mm_loadu_ps(x));
}

// Scores of keys kb[0..NK) for every lane: NK independent chains over the dimensions. The
// block holds key j's element e of KV head h at (j * dp + e) * P + h.
template <int NK, int P>
inline void scores(const float* qt, const float* kb, int dp, int d, __m512* s) {
  for (int j = 0; j < NK; ++j) s[j] = _mm512_setzero_ps();
  for (int e = 0; e < d; ++e) {
    const __m512 q = _mm512_load_ps(qt + e * L);
    for (int j = 0; j < NK; ++j) s[j] = _mm512_fmadd_ps(key_lanes<P>(kb + (static_cast<size_t>(j) * dp + e) * P), q, s[j]);
  }
}

// Key row j of the tile's KV heads into the interleaved block: P rows of dp floats at `rows`
// (row h: KV head h, zero rows past the tile's) to kb[(j * dp + e) * P + h].
template <int P>
inline void interleave_keys(const float* rows, int dp, float* dst) {
  if constexpr (P == 4) {
    // A 4 x 16 transpose per 16 elements: unpack pairs, then pick 128-bit quarters.
    for (int e = 0; e < dp; e += 16) {
      const __m512 a = _mm512_load_ps(rows + e), b = _mm512_load_ps(rows + dp + e);
      const __m512 c = _mm512_load_ps(rows + 2 * dp + e), d = _mm512_load_ps(rows + 3 * dp + e);
      const __m512 ab_lo = _mm512_unpacklo_ps(a, b), ab_hi = _mm512_unpackhi_ps(a, b);
      const __m512 cd_lo = _mm512_unpacklo_ps(c, d), cd_hi = _mm512_unpackhi_ps(c, d);
      // u_k holds, in 128-bit quarter Q, element 4Q + k of a, b, c, d.
      const __m512 u0 = _mm512_shuffle_ps(ab_lo, cd_lo, 0x44), u1 = _mm512_shuffle_ps(ab_lo, cd_lo, 0xEE);
      const __m512 u2 = _mm512_shuffle_ps(ab_hi, cd_hi, 0x44), u3 = _mm512_shuffle_ps(ab_hi, cd_hi, 0xEE);
      const __m512 v0 = _mm512_shuffle_f32x4(u0, u1, 0x44), v1 = _mm512_shuffle_f32x4(u2, u3, 0x44);
      const __m512 v2 = _mm512_shuffle_f32x4(u0, u1, 0xEE), v3 = _mm512_shuffle_f32x4(u2, u3, 0xEE);
      float* o = dst + static_cast<size_t>(e) * 4;
      _mm512_store_ps(o, _mm512_shuffle_f32x4(v0, v1, 0x88));       // elements e .. e+3
      _mm512_store_ps(o + 16, _mm512_shuffle_f32x4(v0, v1, 0xDD));  // e+4 .. e+7
      _mm512_store_ps(o + 32, _mm512_shuffle_f32x4(v2, v3, 0x88));  // e+8 .. e+11
      _mm512_store_ps(o + 48, _mm512_shuffle_f32x4(v2, v3, 0xDD));  // e+12 .. e+15
    }
  } else {
    for (int e = 0; e < dp; ++e)
      for (int h = 0; h < P; ++h) dst[static_cast<size_t>(e) * P + h] = rows[static_cast<size_t>(h) * dp + e];
  }
}

// acc[c] = acc[c] * alpha + sum_j w[j * L] * v[j][c] for the C registers of one query vector.
template <int C>
inline void fold(float* acc, const float* w, float alpha, const float* vb, int nb, int dp) {
  __m512 a[C];
  const __m512 al = _mm512_set1_ps(alpha);
  for (int c = 0; c < C; ++c) a[c] = _mm512_mul_ps(_mm512_load_ps(acc + c * 16), al);
  for (int j = 0; j < nb; ++j) {
    const __m512 wj = _mm512_set1_ps(w[j * L]);
    for (int c = 0; c < C; ++c) a[c] = _mm512_fmadd_ps(wj, _mm512_loadu_ps(vb + j * dp + c * 16), a[c]);
  }
  for (int c = 0; c < C; ++c) _mm512_store_ps(acc + c * 16, a[c]);
}

void fold_any(float* acc, const float* w, float alpha, const float* vb, int nb, int dp) {
  switch (dp / 16) {
    case 1: fold<1>(acc, w, alpha, vb, nb, dp); return;
    case 2: fold<2>(acc, w, alpha, vb, nb, dp); return;
    case 3: fold<3>(acc, w, alpha, vb, nb, dp); return;
    case 4: fold<4>(acc, w, alpha, vb, nb, dp); return;
    case 5: fold<5>(acc, w, alpha, vb, nb, dp); return;
    case 6: fold<6>(acc, w, alpha, vb, nb, dp); return;
    case 7: fold<7>(acc, w, alpha, vb, nb, dp); return;
    case 8: fold<8>(acc, w, alpha, vb, nb, dp); return;
    default:
      // Wide heads: 8 registers at a time (the same arithmetic per element).
      for (int c0 = 0; c0 < dp; c0 += 128) {
        const int cw = dp - c0 < 128 ? dp - c0 : 128;
        switch (cw / 16) {
          case 1: fold<1>(acc + c0, w, alpha, vb + c0, nb, dp); break;
          case 2: fold<2>(acc + c0, w, alpha, vb + c0, nb, dp); break;
          case 3: fold<3>(acc + c0, w, alpha, vb + c0, nb, dp); break;
          case 4: fold<4>(acc + c0, w, alpha, vb + c0, nb, dp); break;
          case 5: fold<5>(acc + c0, w, alpha, vb + c0, nb, dp); break;
          case 6: fold<6>(acc + c0, w, alpha, vb + c0, nb, dp); break;
          case 7: fold<7>(acc + c0, w, alpha, vb + c0, nb, dp); break;
          default: fold<8>(acc + c0, w, alpha, vb + c0, nb, dp); break;
        }
      }
  }
}

}  // namespace

size_t prompt_scratch_floats(int padded_dim) {
  // qt, acc: dp x L each; kb, vb: L keys x dp x k_prompt_max_kv_period each; the K rows of
  // one key being widened (dp x k_prompt_max_kv_period); w; alpha; 16 floats of alignment slack.
  const size_t dp = static_cast<size_t>(padded_dim);
  constexpr size_t P = k_prompt_max_kv_period;
  return dp * L * 2 + 2 * L * dp * P + dp * P + L * L + L + 16;
}

namespace {

template <int P>
void attend_tile(const prompt_tile& t, float* scratch) {
  const int d = t.head_dim, dp = t.padded_dim, H = t.n_heads;
  auto* base = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(scratch) + 63) & ~uintptr_t{63});
  float* qt = base;                                        // [d][L]: the tile's queries, transposed, times scale
  float* acc = qt + static_cast<size_t>(dp) * L;           // [L][dp]: value accumulators per lane
  float* kb = acc + static_cast<size_t>(dp) * L;           // [L keys][dp][P]: widened keys, interleaved
  float* vb = kb + static_cast<size_t>(L) * dp * P;        // [P][L keys][dp]: widened values per KV head
  float* krows = vb + static_cast<size_t>(L) * dp * P;     // [P][dp]: one key's rows before interleaving
  float* w = krows + static_cast<size_t>(dp) * P;          // [L keys][L lanes]: weights of a block
  float* alpha = w + L * L;                                // [L]: rescale of each lane's accumulator
  std::memset(qt, 0, sizeof(float) * static_cast<size_t>(dp) * L);
  std::memset(acc, 0, sizeof(float) * static_cast<size_t>(dp) * L);
  if (t.n_kv < P) std::memset(krows, 0, sizeof(float) * static_cast<size_t>(dp) * P);
  const int M = t.n_rows * H;  // query vectors per KV head
  alignas(64) int32_t pos[L];
  auto lane_q = [&](int i) -> int64_t {  // offset of lane i's query (and output) from t.q
    const int h = i % P, qi = i / P;
    return (qi / H) * t.q_row_stride + static_cast<int64_t>(h * t.group + qi % H) * d;
  };
  for (int i = 0; i < L; ++i) {
    if (i % P >= t.n_kv || i / P >= M) {
      pos[i] = -1;  // an empty lane sees nothing
      continue;
    }
    const float* q = t.q + lane_q(i);
    for (int e = 0; e < d; ++e) qt[e * L + i] = q[e] * t.scale;
    pos[i] = static_cast<int32_t>(t.row0_pos + (i / P) / H);
  }
  const __m512i vpos = _mm512_load_si512(pos);
  const __m512 neg_inf = _mm512_set1_ps(-INFINITY);
  __m512 m = neg_inf, l = _mm512_setzero_ps();
  const int64_t n_keys = t.row0_pos + t.n_rows;  // the tile's last row sees this many
  for (int64_t t0 = 0; t0 < n_keys; t0 += L) {
    const int nb = n_keys - t0 < L ? static_cast<int>(n_keys - t0) : L;
    for (int j = 0; j < nb; ++j) {
      if constexpr (P == 1) {
        widen(t, t.k, t0 + j, 0, kb + static_cast<size_t>(j) * dp);
      } else {
        for (int h = 0; h < t.n_kv; ++h) widen(t, t.k, t0 + j, h, krows + static_cast<size_t>(h) * dp);
        interleave_keys<P>(krows, dp, kb + static_cast<size_t>(j) * dp * P);
      }
      for (int h = 0; h < t.n_kv; ++h) widen(t, t.v, t0 + j, h, vb + (static_cast<size_t>(h) * L + j) * dp);
    }
    __m512 s[L];
    int j0 = 0;
    for (; j0 + 8 <= nb; j0 += 8) scores<8, P>(qt, kb + static_cast<size_t>(j0) * dp * P, dp, d, s + j0);
    for (; j0 + 4 <= nb; j0 += 4) scores<4, P>(qt, kb + static_cast<size_t>(j0) * dp * P, dp, d, s + j0);
    for (; j0 < nb; ++j0) scores<1, P>(qt, kb + static_cast<size_t>(j0) * dp * P, dp, d, s + j0);
    __mmask16 vis[L];
    __m512 mb = neg_inf;
    for (int j = 0; j < nb; ++j) {
      vis[j] = _mm512_cmpge_epi32_mask(vpos, _mm512_set1_epi32(static_cast<int32_t>(t0 + j)));
      s[j] = _mm512_mask_blend_ps(vis[j], neg_inf, s[j]);
      mb = _mm512_max_ps(mb, s[j]);
    }
    const __m512 m_new = _mm512_max_ps(m, mb);
    // A lane that has seen nothing yet (m_new = -inf) keeps alpha = 1 instead of exp(NaN).
    const __mmask16 live = _mm512_cmp_ps_mask(m_new, neg_inf, _CMP_NEQ_OQ);
    const __m512 al = _mm512_mask_blend_ps(live, _mm512_set1_ps(1.0f), exp_ps(_mm512_sub_ps(m, m_new)));
    l = _mm512_mul_ps(l, al);
    for (int j = 0; j < nb; ++j) {
      const __m512 p = _mm512_maskz_mov_ps(vis[j] & live, exp_ps(_mm512_sub_ps(s[j], m_new)));
      l = _mm512_add_ps(l, p);
      _mm512_store_ps(w + j * L, p);
    }
    _mm512_store_ps(alpha, al);
    m = m_new;
    // Each lane folds only the keys its row sees: their weights are the only non-zero ones,
    // and a later key's value row (a non-finite one, say) must not reach an earlier row.
    for (int i = 0; i < L; ++i) {
      if (pos[i] < 0) continue;
      const int64_t seen = pos[i] - t0 + 1;
      fold_any(acc + static_cast<size_t>(i) * dp, w + i, alpha[i], vb + static_cast<size_t>(i % P) * L * dp,
               seen < nb ? static_cast<int>(seen) : nb, dp);
    }
  }
  alignas(64) float sum[L];
  _mm512_store_ps(sum, l);
  for (int i = 0; i < L; ++i) {
    if (pos[i] < 0) continue;
    float* out = t.out + lane_q(i);
    const float inv = 1.0f / sum[i];
    for (int e = 0; e < d; ++e) out[e] = acc[static_cast<size_t>(i) * dp + e] * inv;
  }
}

}  // namespace

void attend_prompt_avx512(const prompt_tile& t, float* scratch) {
  switch (t.kv_period) {
    case 4: return attend_tile<4>(t, scratch);
    case 2: return attend_tile<2>(t, scratch);
    default: return attend_tile<1>(t, scratch);
  }
}

}  // namespace tandem::kernels::cpu
