// The prompt-row attention kernel (attention_impl.h, prompt_tile), written once over a lanes
// type V and compiled per ISA by attention_prompt_avx512.cpp (16 lanes) and
// attention_prompt_avx2.cpp (8), each of which defines V and includes this; include it only
// from files built with at least AVX2, FMA and F16C. Everything is in an unnamed namespace:
// each including file gets its own copy, so none built for one ISA can stand in for another's.
//
// The query vectors of a tile sit in the lanes of a register, so a key's scores for all of
// them are one chain of fused multiply-adds with the key's elements broadcast, the online
// softmax runs lane-wise with a vectorised exponential, and each value row is folded into the
// accumulators of every query vector of the tile. Keys and values are widened once per tile,
// not per row. With several KV heads in a tile (decode rows: one row has too few heads of one
// KV head to fill the lanes) the widened keys are interleaved, element e of every KV head side
// by side, so one 2- or 4-float broadcast hands each lane its own KV head's element. A tile of
// one row (a decode row) on AVX-512 folds the values straight from the cache instead, the
// lanes of one KV head together (fold_lanes), and its keys go from the cache into the
// interleaved block without widened rows in between.
//
// Every lane's arithmetic depends on its own row alone, never on which rows share the tile or
// how far the tile's keys reach: keys a row cannot see get a weight of exactly zero, blocks
// past its last key rescale by exactly one. So a prompt row gets the same result bit for bit
// however the prompt is chunked. Keys go in blocks of k_prompt_lanes (16) on every path: the
// softmax is blockwise, so a lane's running max, sum and rescales depend on where the blocks
// start, never on how many lanes share them, and a row has the same bits on either path.
//
// V provides, over its W float lanes (W divides 16):
//   vec, ivec (W int32), mask (a lane mask: __mmask16, or a vector of all-ones lanes);
//   load / store (aligned), loadu / storeu, set1, zero, add, sub, mul, min, max,
//   fmadd(a, b, c) = a * b + c, fnmadd(a, b, c) = c - a * b, round (to nearest even),
//   scale2(p, n) = p * 2^n for integral n in [-126, 127], rounded once (prompt_exp's steps);
//   load_f16(const uint16_t*): W halves widened (exact);
//   key_lanes<P>(const float*): P floats repeated across the lanes (lane i gets x[i % P]);
//   interleave_keys<P>(rows, dp, dst): P rows of dp floats to dst[e * P + h] (generic below);
//   load_pos(const int32_t*); visible(ivec pos, int32_t k): lanes with pos >= k;
//   blend(mask m, vec no, vec yes): yes in m's lanes; live(vec x): lanes where x != -inf (and
//   not NaN); keep(mask a, mask b, vec x): x in the lanes of both, +0 elsewhere.
#pragma once

#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/cpu/attention_impl.h"

namespace tandem::kernels::cpu {
namespace {

// Key row j of the tile's KV heads into the interleaved block: P rows of dp floats at `rows`
// (row h: KV head h, zero rows past the tile's) to dst[e * P + h].
template <int P>
inline void interleave_keys_any(const float* rows, int dp, float* dst) {
  for (int e = 0; e < dp; ++e)
    for (int h = 0; h < P; ++h) dst[static_cast<size_t>(e) * P + h] = rows[static_cast<size_t>(h) * dp + e];
}

// e^x lane-wise, within a few ulp: 2^n * p(r) with x = n ln2 + r, |r| <= ln2 / 2, ln2 in two
// parts; x is clamped to [-87, 88], so n is in [-126, 127]. exp(0) is exactly 1 (the rescale of a block that changes nothing). Written once so
// that every path takes the same steps, which a row's equal bits on either path rely on.
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

template <class V>
struct prompt_kernel {
  using vec = typename V::vec;
  using mask = typename V::mask;
  static constexpr int L = V::W;             // lanes: query vectors per tile
  static constexpr int KB = k_prompt_lanes;  // keys per block
  static_assert(KB % L == 0);

  // Row `p` of KV head `h` of the tile from a cache (f16 or f32) as head_dim floats, zero to dp.
  static void widen(const prompt_tile& t, const void* base, int64_t p, int h, float* dst) {
    const int64_t off = kv_row_offset(t.pages, t.kv_stride, p) + static_cast<int64_t>(h) * t.head_dim;
    const int d = t.head_dim;
    if (t.kt == kv_type::f32) {
      std::memcpy(dst, static_cast<const float*>(base) + off, static_cast<size_t>(d) * sizeof(float));
    } else {
      const auto* src = static_cast<const uint16_t*>(base) + off;
      int i = 0;
      for (; i + L <= d; i += L) V::storeu(dst + i, V::load_f16(src + i));
      for (; i < d; ++i) dst[i] = _cvtsh_ss(src[i]);
    }
    for (int i = d; i < t.padded_dim; ++i) dst[i] = 0.0f;
  }

  // Whether V transposes P registers of keys straight into the interleaved block.
  template <int P>
  static constexpr bool k_interleaves_regs = requires(const vec* r, float* o) { V::template interleave_regs<P>(r, o); };

  // Key row p of the tile's KV heads from the cache into the interleaved block, without the
  // widened rows in between (their stores and loads back took as long as the transpose).
  // Rows without padding only; KV heads past the tile's are zero, as widened rows would be.
  // off: the key row's offset in the cache (kv_row_offset).
  template <int P>
  static void widen_interleaved(const prompt_tile& t, int64_t off, float* dst) {
    const int d = t.head_dim;
    if (t.kt == kv_type::f16) {
      const uint16_t* src = static_cast<const uint16_t*>(t.k) + off;
      for (int e = 0; e < d; e += L) {
        vec r[P];
        for (int h = 0; h < P; ++h) r[h] = h < t.n_kv ? V::load_f16(src + h * d + e) : V::zero();
        V::template interleave_regs<P>(r, dst + static_cast<size_t>(e) * P);
      }
    } else {
      const float* src = static_cast<const float*>(t.k) + off;
      for (int e = 0; e < d; e += L) {
        vec r[P];
        for (int h = 0; h < P; ++h) r[h] = h < t.n_kv ? V::loadu(src + h * d + e) : V::zero();
        V::template interleave_regs<P>(r, dst + static_cast<size_t>(e) * P);
      }
    }
  }

  // Scores of keys kb[0..NK) for every lane: NK independent chains over the dimensions. The
  // block holds key j's element e of KV head h at (j * dp + e) * P + h.
  template <int NK, int P>
  static void scores(const float* qt, const float* kb, int dp, int d, vec* s) {
    vec acc[NK];
    for (int j = 0; j < NK; ++j) acc[j] = V::zero();
    for (int e = 0; e < d; ++e) {
      const vec q = V::load(qt + e * L);
      for (int j = 0; j < NK; ++j) acc[j] = V::fmadd(V::template key_lanes<P>(kb + (static_cast<size_t>(j) * dp + e) * P), q, acc[j]);
    }
    for (int j = 0; j < NK; ++j) s[j] = acc[j];
  }

  // acc[c] = acc[c] * alpha + sum_j w[j * L] * v[j][c] for the C registers of one query vector.
  template <int C>
  static void fold(float* acc, const float* w, float alpha, const float* vb, int nb, int dp) {
    vec a[C];
    const vec al = V::set1(alpha);
    for (int c = 0; c < C; ++c) a[c] = V::mul(V::load(acc + c * L), al);
    for (int j = 0; j < nb; ++j) {
      const vec wj = V::set1(w[j * L]);
      for (int c = 0; c < C; ++c) a[c] = V::fmadd(wj, V::loadu(vb + j * dp + c * L), a[c]);
    }
    for (int c = 0; c < C; ++c) V::store(acc + c * L, a[c]);
  }

  // Up to 8 registers at a time (the same arithmetic per element whatever the split).
  static void fold_any(float* acc, const float* w, float alpha, const float* vb, int nb, int dp) {
    for (int c0 = 0; c0 < dp; c0 += 8 * L) {
      switch (dp - c0 < 8 * L ? (dp - c0) / L : 8) {
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

  // Offset of key t0's row, t0 a multiple of KB: the block's KB rows follow it kv_stride
  // apart, also in a paged cache, whose pages hold a multiple of KB positions (attention.cpp
  // checks) and so never split a block.
  static_assert(KB == k_attention_key_block);
  static int64_t block_rows_at(const prompt_tile& t, int64_t t0) { return kv_row_offset(t.pages, t.kv_stride, t0); }

  // For a tile that folds from the cache: asks, as key j of the block at t0 is widened, for
  // its value row (the fold reads it after the block's scores) and for key j's row of the next
  // block, into L1. One key's lines at a time: a whole block's requests at once filled the
  // core's line buffers and it stalled on them (this way a batched step's attention is ~12%
  // faster; without requests ~20% slower). Inlined by force: as a call GCC left out of line
  // the same requests were slower than a block's.
  __attribute__((always_inline)) static void request_rows(const prompt_tile& t, int64_t t0, int j, int64_t n_keys) {
    const int64_t elem = t.kt == kv_type::f16 ? 2 : 4;
    const int64_t row_bytes = static_cast<int64_t>(t.n_kv) * t.head_dim * elem;
    const char* v = static_cast<const char*>(t.v) + (block_rows_at(t, t0) + j * t.kv_stride) * elem;
    for (int64_t b = 0; b < row_bytes; b += 64) _mm_prefetch(v + b, _MM_HINT_T0);
    if (t0 + KB + j >= n_keys) return;
    const char* k = static_cast<const char*>(t.k) + (block_rows_at(t, t0 + KB) + j * t.kv_stride) * elem;
    for (int64_t b = 0; b < row_bytes; b += 64) _mm_prefetch(k + b, _MM_HINT_T0);
  }

  // The fold of one block for G lanes that share KV head h, straight from the cache: each
  // value row is loaded (widened from f16) once for the G lanes, whose accumulators stay in
  // registers through the block. Every lane takes fold<C>'s steps for all nb keys (a decode
  // row's lanes see every key of each block), so the bits are the same.
  template <int C, int G>
  static void fold_lanes(float* acc, const int* lane, const float* w, const float* alpha, const prompt_tile& t, int64_t t0,
                         int nb, int h) {
    vec a[G][C];
    for (int g = 0; g < G; ++g) {
      const vec al = V::set1(alpha[lane[g]]);
      for (int c = 0; c < C; ++c) a[g][c] = V::mul(V::load(acc + static_cast<size_t>(lane[g]) * t.padded_dim + c * L), al);
    }
    // A block's keys lie in one page of a paged cache (block_rows_at).
    const int64_t row0 = block_rows_at(t, t0) + static_cast<int64_t>(h) * t.head_dim;
    for (int j = 0; j < nb; ++j) {
      const int64_t off = row0 + j * t.kv_stride;
      vec v[C];
      if (t.kt == kv_type::f16) {
        const auto* src = static_cast<const uint16_t*>(t.v) + off;
        for (int c = 0; c < C; ++c) v[c] = V::load_f16(src + c * L);
      } else {
        const auto* src = static_cast<const float*>(t.v) + off;
        for (int c = 0; c < C; ++c) v[c] = V::loadu(src + c * L);
      }
      for (int g = 0; g < G; ++g) {
        const vec wj = V::set1(w[j * L + lane[g]]);
        for (int c = 0; c < C; ++c) a[g][c] = V::fmadd(wj, v[c], a[g][c]);
      }
    }
    for (int g = 0; g < G; ++g)
      for (int c = 0; c < C; ++c) V::store(acc + static_cast<size_t>(lane[g]) * t.padded_dim + c * L, a[g][c]);
  }

  // Every live lane of a one-row tile, by KV head, in groups of up to k_fold_group(C) lanes.
  template <int C>
  static void fold_row_block(float* acc, const float* w, const float* alpha, const prompt_tile& t, int P, int64_t t0, int nb) {
    constexpr int G = k_fold_group(C);
    for (int h = 0; h < t.n_kv; ++h) {
      for (int q0 = 0; q0 < t.n_heads; q0 += G) {
        int lane[G];
        const int n = t.n_heads - q0 < G ? t.n_heads - q0 : G;
        for (int g = 0; g < n; ++g) lane[g] = (q0 + g) * P + h;
        switch (n) {
          case 1: fold_lanes<C, 1>(acc, lane, w, alpha, t, t0, nb, h); break;
          case 2: if constexpr (G >= 2) fold_lanes<C, 2>(acc, lane, w, alpha, t, t0, nb, h); break;
          case 3: if constexpr (G >= 3) fold_lanes<C, 3>(acc, lane, w, alpha, t, t0, nb, h); break;
          default: if constexpr (G >= 4) fold_lanes<C, 4>(acc, lane, w, alpha, t, t0, nb, h); break;
        }
      }
    }
  }

  // Lanes per group of fold_lanes: their accumulators (G x C registers) and the C value
  // registers fit the 32 of AVX-512 with room to spare.
  static constexpr int k_fold_group(int C) { return C <= 4 ? 4 : C <= 5 ? 3 : 2; }

  // Whether a tile takes fold_row_block: one row (every lane sees every key), rows without
  // padding (the cache rows are read as they are), up to 8 registers a row, AVX-512.
  static bool folds_from_cache(const prompt_tile& t) {
    return V::k_fold_from_cache && t.n_rows == 1 && t.head_dim == t.padded_dim && t.padded_dim % L == 0 &&
           t.padded_dim <= 8 * L;
  }

  static void fold_row_any(float* acc, const float* w, const float* alpha, const prompt_tile& t, int P, int64_t t0, int nb) {
    switch (t.padded_dim / L) {
      case 1: return fold_row_block<1>(acc, w, alpha, t, P, t0, nb);
      case 2: return fold_row_block<2>(acc, w, alpha, t, P, t0, nb);
      case 3: return fold_row_block<3>(acc, w, alpha, t, P, t0, nb);
      case 4: return fold_row_block<4>(acc, w, alpha, t, P, t0, nb);
      case 5: return fold_row_block<5>(acc, w, alpha, t, P, t0, nb);
      case 6: return fold_row_block<6>(acc, w, alpha, t, P, t0, nb);
      case 7: return fold_row_block<7>(acc, w, alpha, t, P, t0, nb);
      default: return fold_row_block<8>(acc, w, alpha, t, P, t0, nb);
    }
  }

  template <int P>
  static void attend_tile(const prompt_tile& t, float* scratch) {
    const int d = t.head_dim, dp = t.padded_dim, H = t.n_heads;
    auto* base = reinterpret_cast<float*>((reinterpret_cast<uintptr_t>(scratch) + 63) & ~uintptr_t{63});
    float* qt = base;                                      // [d][L]: the tile's queries, transposed, times scale
    float* acc = qt + static_cast<size_t>(dp) * L;         // [L][dp]: value accumulators per lane
    float* kb = acc + static_cast<size_t>(dp) * L;         // [KB keys][dp][P]: widened keys, interleaved
    float* vb = kb + static_cast<size_t>(KB) * dp * P;     // [P][KB keys][dp]: widened values per KV head
    float* krows = vb + static_cast<size_t>(KB) * dp * P;  // [P][dp]: one key's rows before interleaving
    float* w = krows + static_cast<size_t>(dp) * P;        // [KB keys][L lanes]: weights of a block
    float* alpha = w + KB * L;                             // [L]: rescale of each lane's accumulator
    std::memset(qt, 0, sizeof(float) * static_cast<size_t>(dp) * L);
    std::memset(acc, 0, sizeof(float) * static_cast<size_t>(dp) * L);
    if (t.n_kv < P) std::memset(krows, 0, sizeof(float) * static_cast<size_t>(dp) * P);
    const int M = t.n_rows * H;  // query vectors per KV head
    // A decode row folds straight from the cache (fold_row_block), so its values are not widened.
    const bool from_cache = folds_from_cache(t);
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
    const auto vpos = V::load_pos(pos);
    const vec neg_inf = V::set1(-INFINITY), one = V::set1(1.0f);
    vec m = neg_inf, l = V::zero();
    const int64_t n_keys = t.row0_pos + t.n_rows;  // the tile's last row sees this many
    for (int64_t t0 = 0; t0 < n_keys; t0 += KB) {
      const int nb = n_keys - t0 < KB ? static_cast<int>(n_keys - t0) : KB;
      for (int j = 0; j < nb; ++j) {
        if (from_cache) request_rows(t, t0, j, n_keys);
        if constexpr (P == 1) {
          widen(t, t.k, t0 + j, 0, kb + static_cast<size_t>(j) * dp);
        } else {
          bool interleaved = false;
          if constexpr (k_interleaves_regs<P>) {
            if (t.head_dim == dp) {
              widen_interleaved<P>(t, block_rows_at(t, t0) + j * t.kv_stride, kb + static_cast<size_t>(j) * dp * P);
              interleaved = true;
            }
          }
          if (!interleaved) {
            for (int h = 0; h < t.n_kv; ++h) widen(t, t.k, t0 + j, h, krows + static_cast<size_t>(h) * dp);
            V::template interleave_keys<P>(krows, dp, kb + static_cast<size_t>(j) * dp * P);
          }
        }
        if (!from_cache)
          for (int h = 0; h < t.n_kv; ++h) widen(t, t.v, t0 + j, h, vb + (static_cast<size_t>(h) * KB + j) * dp);
      }
      vec s[KB];
      int j0 = 0;
      for (; j0 + 8 <= nb; j0 += 8) scores<8, P>(qt, kb + static_cast<size_t>(j0) * dp * P, dp, d, s + j0);
      for (; j0 + 4 <= nb; j0 += 4) scores<4, P>(qt, kb + static_cast<size_t>(j0) * dp * P, dp, d, s + j0);
      for (; j0 < nb; ++j0) scores<1, P>(qt, kb + static_cast<size_t>(j0) * dp * P, dp, d, s + j0);
      mask vis[KB];
      vec mb = neg_inf;
      for (int j = 0; j < nb; ++j) {
        vis[j] = V::visible(vpos, static_cast<int32_t>(t0 + j));
        s[j] = V::blend(vis[j], neg_inf, s[j]);
        mb = V::max(mb, s[j]);
      }
      const vec m_new = V::max(m, mb);
      // A lane that has seen nothing yet (m_new = -inf) keeps alpha = 1 instead of exp(NaN).
      const mask live = V::live(m_new);
      const vec al = V::blend(live, one, prompt_exp<V>(V::sub(m, m_new)));
      l = V::mul(l, al);
      for (int j = 0; j < nb; ++j) {
        const vec p = V::keep(vis[j], live, prompt_exp<V>(V::sub(s[j], m_new)));
        l = V::add(l, p);
        V::store(w + j * L, p);
      }
      V::store(alpha, al);
      m = m_new;
      if (from_cache) {
        fold_row_any(acc, w, alpha, t, P, t0, nb);
        continue;
      }
      // Each lane folds only the keys its row sees: their weights are the only non-zero ones,
      // and a later key's value row (a non-finite one, say) must not reach an earlier row.
      for (int i = 0; i < L; ++i) {
        if (pos[i] < 0) continue;
        const int64_t seen = pos[i] - t0 + 1;
        fold_any(acc + static_cast<size_t>(i) * dp, w + i, alpha[i], vb + static_cast<size_t>(i % P) * KB * dp,
                 seen < nb ? static_cast<int>(seen) : nb, dp);
      }
    }
    alignas(64) float sum[L];
    V::store(sum, l);
    for (int i = 0; i < L; ++i) {
      if (pos[i] < 0) continue;
      float* out = t.out + lane_q(i);
      const float inv = 1.0f / sum[i];
      for (int e = 0; e < d; ++e) out[e] = acc[static_cast<size_t>(i) * dp + e] * inv;
    }
  }

  static void run(const prompt_tile& t, float* scratch) {
    switch (t.kv_period) {
      case 4: return attend_tile<4>(t, scratch);
      case 2: return attend_tile<2>(t, scratch);
      default: return attend_tile<1>(t, scratch);
    }
  }
};

}  // namespace
}  // namespace tandem::kernels::cpu
