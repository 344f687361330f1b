// The SIMD attention kernel, written once over a vector type L and compiled per ISA by
// attention_avx2.cpp and attention_avx512.cpp (each includes this after defining L). Include
// it only from files built with at least AVX2, FMA and F16C. It lives in an unnamed
// namespace: every including file gets its own copy, so no copy built for one ISA can stand
// in for another's.
//
// L provides, lane-wise over its W floats (W divides k_attention_pad):
//   vec; load(const float*); store(float*, vec); zero(); set1(float); add; mul;
//   round_f16(a) (nearest even, widened back); load_f16(const uint16_t*) for W halves;
//   unfused(a), which returns a unchanged but keeps the compiler from fusing the multiply that
//   made it into a following add; fold_slices, how many W-lane accumulators one fold holds.
// Optionally online_weights (below) and widen_keys_paired + dot_pairs, which score an f16 key
// block two keys to a register (AVX-512's).
//
// Arithmetic contract: attention_impl.h. Per key block the keys and values are widened into
// scratch once for every head of the group; each head scores the block (eight keys at a
// time, so eight dot chains overlap, or by L's dot_pairs), then each finds its online-softmax
// weights (key by key here, or by an L's own online_weights: AVX-512's takes 16 keys at once); the running sums
// advance four heads to a register; then the value rows are folded into the accumulators, up
// to L::fold_slices W-lane slices of whole heads held in registers across the block, so that
// their f16 round trips overlap.
#pragma once

#include <immintrin.h>
#include <math.h>  // expf: the C function, as the scalar path calls it

#include <array>
#include <cstdint>
#include <cstring>
#include <utility>

#include "kernels/cpu/attention_impl.h"
#include "kernels/cpu/unfused.h"

namespace tandem::kernels::cpu {
namespace {

template <class L>
struct simd_attention {
  using vec = typename L::vec;
  static constexpr int W = L::W;
  static constexpr int B = k_attention_key_block;

  // A row of d halves -> dp floats, zero beyond d. The tail goes through a zeroed copy so that
  // no load reads past the row (the next head's data, or the end of the cache).
  static void widen_row(const uint16_t* src, float* dst, int d, int dp) {
    int i = 0;
    for (; i + W <= d; i += W) L::store(dst + i, L::load_f16(src + i));
    if (i < dp) {
      uint16_t tail[k_attention_pad] = {};
      std::memcpy(tail, src + i, static_cast<size_t>(d - i) * sizeof(uint16_t));
      for (int j = 0; i + j < dp; j += W) L::store(dst + i + j, L::load_f16(tail + j));
    }
  }

  static void copy_row(const float* src, float* dst, int d, int dp) {
    int i = 0;
    for (; i + W <= d; i += W) L::store(dst + i, L::load(src + i));
    if (i < dp) {
      float tail[k_attention_pad] = {};
      std::memcpy(tail, src + i, static_cast<size_t>(d - i) * sizeof(float));
      for (int j = 0; i + j < dp; j += W) L::store(dst + i + j, L::load(tail + j));
    }
  }

  // scores[j] = dot(q, row j) * scale for j < NK (1..8), rows `stride` floats apart, in the
  // order of the contract: eight lanes, the tail into lane 0, then the pairwise tree. Each key
  // is one chain of dependent adds; eight at a time keep more of them in flight (3.7 -> 3.2
  // cycles per head and key, head_dim 64).
  // Halves: q and the rows hold f16 values (the f16 cache's contract), whose products have at
  // most 22 significant bits and lie far inside float's range, so every product is exact and
  // a fused multiply-add rounds exactly as the product-then-add of the contract: one operation
  // instead of two (the f32 cache's products round, so they stay apart).
  template <int NK, bool Halves>
  static void dot_keys(const float* q, const float* rows, int64_t stride, int d, float scale, float* scores) {
    __m256 acc[8];
    for (int j = 0; j < 8; ++j) acc[j] = _mm256_setzero_ps();
    int i = 0;
    for (; i + 8 <= d; i += 8) {
      const __m256 x = _mm256_loadu_ps(q + i);
      // Unrolled, or GCC below -O3 keeps acc in memory and every add waits on a store and a
      // reload (10.6 cycles per head and key at -O2).
#pragma GCC unroll 8
      for (int j = 0; j < NK; ++j) {
        const __m256 y = _mm256_loadu_ps(rows + j * stride + i);
        acc[j] = Halves ? _mm256_fmadd_ps(x, y, acc[j]) : _mm256_add_ps(acc[j], unfused(_mm256_mul_ps(x, y)));
      }
    }
    for (int j = 0; j < NK; ++j) {
      if (i == d) break;
      __m128 s = _mm256_castps256_ps128(acc[j]);
      for (int e = i; e < d; ++e) {
        const __m128 x = _mm_load_ss(q + e), y = _mm_load_ss(rows + j * stride + e);
        s = Halves ? _mm_fmadd_ss(x, y, s) : _mm_add_ss(s, unfused(_mm_mul_ss(x, y)));
      }
      acc[j] = _mm256_blend_ps(acc[j], _mm256_castps128_ps256(s), 1);
    }
    // hadd twice leaves (s0+s1)+(s2+s3) of key j in lane j and (s4+s5)+(s6+s7) in lane 4+j.
    alignas(32) float out[8];
    for (int g = 0; g < NK; g += 4) {
      const __m256 h = _mm256_hadd_ps(_mm256_hadd_ps(acc[g], acc[g + 1]), _mm256_hadd_ps(acc[g + 2], acc[g + 3]));
      const __m128 dots = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
      _mm_store_ps(out + g, _mm_mul_ps(dots, _mm_set1_ps(scale)));
    }
    for (int j = 0; j < NK; ++j) scores[j] = out[j];
  }

  template <bool Halves>
  static void dots(const float* q, const float* rows, int64_t stride, int n, int d, float scale, float* scores) {
    int b = 0;
    for (; b + 8 <= n; b += 8) dot_keys<8, Halves>(q, rows + b * stride, stride, d, scale, scores + b);
    switch (n - b) {
      case 7: dot_keys<7, Halves>(q, rows + b * stride, stride, d, scale, scores + b); break;
      case 6: dot_keys<6, Halves>(q, rows + b * stride, stride, d, scale, scores + b); break;
      case 5: dot_keys<5, Halves>(q, rows + b * stride, stride, d, scale, scores + b); break;
      case 4: dot_keys<4, Halves>(q, rows + b * stride, stride, d, scale, scores + b); break;
      case 3: dot_keys<3, Halves>(q, rows + b * stride, stride, d, scale, scores + b); break;
      case 2: dot_keys<2, Halves>(q, rows + b * stride, stride, d, scale, scores + b); break;
      case 1: dot_keys<1, Halves>(q, rows + b * stride, stride, d, scale, scores + b); break;
      default: break;
    }
  }

  // Online softmax over the scores of one key block, key by key: ms[b] rescales what is
  // accumulated (1: untouched), w[b] weighs the value row; m is the running max. An L may
  // provide its own online_weights with the same results (the AVX-512 one does, vectorised).
  // Keys nb .. B-1 get ms 1 and w 0 (update_sums relies on it).
  static void online_weights(const float* sc, int nb, float& m, float* ms, float* w) {
    for (int b = 0; b < nb; ++b) {
      ms[b] = 1.0f;
      w[b] = 1.0f;
      if (sc[b] > m) {
        ms[b] = expf(m - sc[b]);  // 0 on the first key (m = -inf)
        m = sc[b];
      } else {
        w[b] = expf(sc[b] - m);
      }
    }
    for (int b = nb; b < B; ++b) {
      ms[b] = 1.0f;
      w[b] = 0.0f;
    }
  }

  // sum[h] = sum[h] * ms[h][b] + w[h][b] for keys b < nb (a multiple of 4, at most B) of nh
  // heads (rows of B floats in ms and w), key by key, the product rounded before the add.
  // Each head's sum is one chain of dependent operations, so heads go four to a register
  // (a 4 x 4 transpose turns four heads' rows into four keys' columns) and their chains
  // overlap instead of waiting on one another.
  static void update_sums(float* sum, const float* ms, const float* w, int nh, int nb) {
    int h = 0;
    for (; h + 4 <= nh; h += 4) {
      __m128 acc = _mm_loadu_ps(sum + h);
      for (int b = 0; b < nb; b += 4) {
        __m128 m0 = _mm_loadu_ps(ms + (h + 0) * B + b), m1 = _mm_loadu_ps(ms + (h + 1) * B + b);
        __m128 m2 = _mm_loadu_ps(ms + (h + 2) * B + b), m3 = _mm_loadu_ps(ms + (h + 3) * B + b);
        __m128 w0 = _mm_loadu_ps(w + (h + 0) * B + b), w1 = _mm_loadu_ps(w + (h + 1) * B + b);
        __m128 w2 = _mm_loadu_ps(w + (h + 2) * B + b), w3 = _mm_loadu_ps(w + (h + 3) * B + b);
        _MM_TRANSPOSE4_PS(m0, m1, m2, m3);
        _MM_TRANSPOSE4_PS(w0, w1, w2, w3);
        acc = _mm_add_ps(unfused(_mm_mul_ps(acc, m0)), w0);
        acc = _mm_add_ps(unfused(_mm_mul_ps(acc, m1)), w1);
        acc = _mm_add_ps(unfused(_mm_mul_ps(acc, m2)), w2);
        acc = _mm_add_ps(unfused(_mm_mul_ps(acc, m3)), w3);
      }
      _mm_storeu_ps(sum + h, acc);
    }
    for (; h < nh; ++h) {
      float acc = sum[h];
      for (int b = 0; b < nb; ++b) {
        const __m128 scaled = unfused(_mm_mul_ss(_mm_set_ss(acc), _mm_set_ss(ms[h * B + b])));
        acc = _mm_cvtss_f32(_mm_add_ss(scaled, _mm_set_ss(w[h * B + b])));
      }
      sum[h] = acc;
    }
  }

  // out[0..d) = acc * (1 / sum), as the scalar path's final division.
  static void finish(const float* acc, float sum, float* out, int d) {
    const float inv = 1.0f / sum;
    const vec vinv = L::set1(inv);
    int i = 0;
    for (; i + W <= d; i += W) L::store(out + i, L::mul(L::load(acc + i), vinv));
    for (; i < d; ++i) out[i] = acc[i] * inv;
  }

  // The accumulators of NH heads, NS slices of W lanes each (NS * NH <= k_fold), fold in the
  // block's value rows key by key: head j's slices start at acc + j * dp (value lanes at vals,
  // rows dp floats apart), with rescale ms[j * B + b] and weight w[j * B + b] for key b. The
  // slices are independent, so their f16 round trips overlap instead of queuing behind one
  // another (measured on the avx2 path: 1.2x faster than one slice at a time at head_dim 64,
  // 1.7x at 128); a head's rescale test and weight broadcast serve all its slices.
  // As many slices as the ISA has registers for beside the loop's temporaries: 8 of AVX2's 16
  // registers, 16 of AVX-512's 32 (every slice of four 64-lane heads, which overlapped their
  // round trips better than two heads at a time: +0.8% on a 250M decode at 128 tokens).
  static constexpr int k_fold = L::fold_slices;
  template <int NS, int NH>
  static void fold(float* acc, const float* vals, const float* ms, const float* w, int nb, int dp) {
    vec a[NH][NS];
    for (int j = 0; j < NH; ++j)
      for (int i = 0; i < NS; ++i) a[j][i] = L::load(acc + j * dp + i * W);
    for (int b = 0; b < nb; ++b) {
      const float* row = vals + b * dp;
      for (int j = 0; j < NH; ++j) {
        // acc * 1 rounds to itself (acc holds f16 values), so skipping ms == 1 changes nothing.
        const float m = ms[j * B + b];
        if (m != 1.0f) {
          const vec mv = L::set1(m);
          for (int i = 0; i < NS; ++i) a[j][i] = L::round_f16(L::mul(a[j][i], mv));
        }
        const vec wv = L::set1(w[j * B + b]);
        for (int i = 0; i < NS; ++i) a[j][i] = L::round_f16(L::add(a[j][i], L::unfused(L::mul(L::load(row + i * W), wv))));
      }
    }
    for (int j = 0; j < NH; ++j)
      for (int i = 0; i < NS; ++i) L::store(acc + j * dp + i * W, a[j][i]);
  }

  using fold_fn = void (*)(float*, const float*, const float*, const float*, int, int);
  // Entry I of the table below: NS = I / k_fold + 1, NH = I % k_fold + 1; combinations with
  // NS * NH > k_fold are never called and hold fold<NS, 1> instead of an instantiation of
  // their own.
  static constexpr int table_ns(int i) { return i / k_fold + 1; }
  static constexpr int table_nh(int i) { return (i % k_fold + 1) * table_ns(i) <= k_fold ? i % k_fold + 1 : 1; }
  template <int... I>
  static constexpr auto fold_table(std::integer_sequence<int, I...>) {
    return std::array<fold_fn, sizeof...(I)>{&fold<table_ns(I), table_nh(I)>...};
  }
  static constexpr auto k_folds = fold_table(std::make_integer_sequence<int, k_fold * k_fold>{});

  // Every accumulator of heads [h_begin, h_end): slices k_fold at a time, as many heads to a
  // call as fill k_fold slices.
  static void fold_heads(const attention_scratch& s, int h_begin, int h_end, int nb, int dp) {
    const int slices = dp / W;
    for (int i0 = 0; i0 < slices; i0 += k_fold) {
      const int ns = slices - i0 < k_fold ? slices - i0 : k_fold;
      const int per_call = k_fold / ns;
      for (int h = h_begin; h < h_end; h += per_call) {
        const int nh = h_end - h < per_call ? h_end - h : per_call;
        k_folds[static_cast<size_t>((ns - 1) * k_fold + nh - 1)](s.acc + h * dp + i0 * W, s.v + i0 * W, s.ms + h * B,
                                                                 s.w + h * B, nb, dp);
      }
    }
  }

  // Whether L scores a key block two keys to a register (AVX-512: widen_keys_paired and
  // dot_pairs, for heads whose size is a multiple of 8; the layout of s.k is then theirs).
  static constexpr bool paired = requires { L::dot_pairs(nullptr, nullptr, 0, 0.0f, nullptr); };

  // Every row of the task against each key block, widened once for all of them. Head h of the
  // scratch is row h / G's head h % G; a row stops at its own last key (row r attends
  // n_keys + r), so each row's arithmetic is that of a task of its own.
  static void run_f16(const attention_task& t, const attention_scratch& s) {
    const int d = t.head_dim, dp = t.padded_dim, G = t.n_group, H = t.n_rows * t.n_group;
    const bool pair_keys = paired && d % 8 == 0;  // s.k in widen_keys_paired's layout
    const auto* k = static_cast<const uint16_t*>(t.k);
    const auto* v = static_cast<const uint16_t*>(t.v);
    for (int h = 0; h < H; ++h) {
      float* q = s.q + h * dp;
      copy_row(t.q + (h / G) * t.row_stride + (h % G) * d, q, d, dp);
      for (int i = 0; i < dp; i += W) {
        L::store(q + i, L::round_f16(L::load(q + i)));
        L::store(s.acc + h * dp + i, L::zero());
      }
      s.m[h] = -__builtin_inff();
      s.sum[h] = 0.0f;
    }

    const int64_t last_keys = t.n_keys + t.n_rows - 1;
    for (int64_t t0 = 0; t0 < last_keys; t0 += B) {
      const int nb_all = last_keys - t0 < B ? static_cast<int>(last_keys - t0) : B;
      int64_t off[B];
      for (int b = 0; b < nb_all; ++b) off[b] = kv_row_offset(t.pages, t.kv_stride, t0 + b);
      if constexpr (paired) {
        if (pair_keys) {
          const uint16_t* rows[B];
          for (int b = 0; b < nb_all; ++b) rows[b] = k + off[b];
          L::widen_keys_paired(rows, nb_all, d, s.k);
        }
      }
      for (int b = 0; b < nb_all; ++b) {
        if (!pair_keys) widen_row(k + off[b], s.k + b * dp, d, dp);
        widen_row(v + off[b], s.v + b * dp, d, dp);
      }
      // The next block's rows, asked for while this one is computed: in decode the cache has
      // usually left every cache level since the last token's pass over this layer.
      const int64_t next_end = last_keys < t0 + 2 * B ? last_keys : t0 + 2 * B;
      for (int64_t p = t0 + B; p < next_end; ++p) {
        const char* kr = reinterpret_cast<const char*>(k + kv_row_offset(t.pages, t.kv_stride, p));
        const char* vr = reinterpret_cast<const char*>(v + kv_row_offset(t.pages, t.kv_stride, p));
        for (int off = 0; off < d * 2; off += 64) {
          _mm_prefetch(kr + off, _MM_HINT_T0);
          _mm_prefetch(vr + off, _MM_HINT_T0);
        }
      }
      // Rows before r_begin have seen all their keys (a row sees t.n_keys + r of them).
      const int r_begin = t0 < t.n_keys ? 0 : static_cast<int>(t0 - t.n_keys + 1);
      for (int r = r_begin; r < t.n_rows; ++r) {
        const int64_t keys = t.n_keys + r;
        const int nb = keys - t0 < B ? static_cast<int>(keys - t0) : B;
        // Every head's scores first, then every head's weights: a head's weights wait on its
        // scores (the dot chains, then a prefix max and expf), so scoring the heads in turn
        // left that wait exposed once per head; apart, the weights of several heads overlap.
        for (int h = r * G; h < (r + 1) * G; ++h) {
          if (!pair_keys) {
            dots<true>(s.q + h * dp, s.k, dp, nb, d, t.scale, s.scores + h * B);
          } else if constexpr (paired) {
            L::dot_pairs(s.q + h * dp, s.k, d, t.scale, s.scores + h * B);
          }
        }
        for (int h = r * G; h < (r + 1) * G; ++h) {
          float* sc = s.scores + h * B;
          if constexpr (requires { L::online_weights(sc, nb, s.m[h], s.ms, s.w); }) {
            L::online_weights(sc, nb, s.m[h], s.ms + h * B, s.w + h * B);
          } else {
            online_weights(sc, nb, s.m[h], s.ms + h * B, s.w + h * B);
          }
        }
      }
      // Keys past a row's last have ms 1 and w 0, which leave its sum as it is, so every
      // active head's sum takes the block's keys up to a multiple of four.
      update_sums(s.sum + r_begin * G, s.ms + r_begin * G * B, s.w + r_begin * G * B, H - r_begin * G,
                  (nb_all + 3) & ~3);

      for (int r = r_begin; r < t.n_rows; ++r) {
        const int64_t keys = t.n_keys + r;
        const int nb = keys - t0 < B ? static_cast<int>(keys - t0) : B;
        fold_heads(s, r * G, (r + 1) * G, nb, dp);
      }
    }
    for (int h = 0; h < H; ++h) finish(s.acc + h * dp, s.sum[h], t.out + (h / G) * t.row_stride + (h % G) * d, d);
  }

  static void run_f32(const attention_task& t, const attention_scratch& s) {
    const int d = t.head_dim, dp = t.padded_dim, G = t.n_group;
    const int64_t n = t.n_keys;
    const auto* k = static_cast<const float*>(t.k);
    const auto* v = static_cast<const float*>(t.v);
    // Rows are read in place when whole vectors cover them, else copied padded into scratch.
    const bool in_place = d % W == 0;
    auto block = [&](const float* base, float* pad, int64_t t0, int nb, int64_t& stride) -> const float* {
      if (in_place) {
        // The B keys from t0 (a multiple of B) are in one block: block_tokens is a multiple of B.
        stride = t.kv_stride;
        return base + kv_row_offset(t.pages, t.kv_stride, t0);
      }
      for (int b = 0; b < nb; ++b) copy_row(base + kv_row_offset(t.pages, t.kv_stride, t0 + b), pad + b * dp, d, dp);
      stride = dp;
      return pad;
    };
    const int dv = in_place ? d : dp;  // lanes the value loop covers

    // Two passes, as the scalar path: all scores, softmax, then the weighted sum of values.
    for (int64_t t0 = 0; t0 < n; t0 += B) {
      const int nb = n - t0 < B ? static_cast<int>(n - t0) : B;
      int64_t stride = 0;
      const float* rows = block(k, s.k, t0, nb, stride);
      for (int g = 0; g < G; ++g) dots<false>(t.q + g * d, rows, stride, nb, d, t.scale, s.scores + g * n + t0);
    }
    for (int g = 0; g < G; ++g) {
      softmax(s.scores + g * n, n);
      for (int i = 0; i < dp; i += W) L::store(s.acc + g * dp + i, L::zero());
    }
    for (int64_t t0 = 0; t0 < n; t0 += B) {
      const int nb = n - t0 < B ? static_cast<int>(n - t0) : B;
      int64_t stride = 0;
      const float* rows = block(v, s.v, t0, nb, stride);
      for (int g = 0; g < G; ++g) {
        const float* p = s.scores + g * n + t0;
        float* acc = s.acc + g * dp;
        for (int i = 0; i < dv; i += W) {
          vec a = L::load(acc + i);
          for (int b = 0; b < nb; ++b) a = L::add(a, L::unfused(L::mul(L::set1(p[b]), L::load(rows + b * stride + i))));
          L::store(acc + i, a);
        }
      }
    }
    for (int g = 0; g < G; ++g) std::memcpy(t.out + g * d, s.acc + g * dp, static_cast<size_t>(d) * sizeof(float));
  }

  static void run(const attention_task& t, const attention_scratch& s) {
    if (t.kt == kv_type::f16) {
      run_f16(t, s);
    } else {
      for (int r = 0; r < t.n_rows; ++r) run_f32(task_row(t, r), s);
    }
  }
};

}  // namespace
}  // namespace tandem::kernels::cpu
