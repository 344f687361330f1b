// The SIMD attention kernels of attention_impl.h, each written once over a lane type and
// compiled per ISA by the files that define one: exact attention (simd_attention) and the
// engine's tiled prompt-row attention (prompt_kernel). Include this only from files built with
// at least AVX2, FMA and F16C. Everything lives in an unnamed namespace: every including file
// gets its own copy, so no copy built for one ISA can stand in for another's.
#pragma once

#include <immintrin.h>
#include <math.h>  // expf: the C function, as the scalar path calls it

#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <utility>

#include "kernels/cpu/attention_impl.h"
#include "kernels/cpu/simd_avx2.h"  // unfused

namespace tandem::kernels::cpu {
namespace {

// The exact attention kernel (simd_attention), written once over a vector type L and compiled
// per ISA by attention_avx2.cpp and attention_avx512.cpp (each includes this after defining L).
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
      case 7:
        dot_keys<7, Halves>(q, rows + b * stride, stride, d, scale, scores + b);
        break;
      case 6:
        dot_keys<6, Halves>(q, rows + b * stride, stride, d, scale, scores + b);
        break;
      case 5:
        dot_keys<5, Halves>(q, rows + b * stride, stride, d, scale, scores + b);
        break;
      case 4:
        dot_keys<4, Halves>(q, rows + b * stride, stride, d, scale, scores + b);
        break;
      case 3:
        dot_keys<3, Halves>(q, rows + b * stride, stride, d, scale, scores + b);
        break;
      case 2:
        dot_keys<2, Halves>(q, rows + b * stride, stride, d, scale, scores + b);
        break;
      case 1:
        dot_keys<1, Halves>(q, rows + b * stride, stride, d, scale, scores + b);
        break;
      default:
        break;
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
        k_folds[static_cast<size_t>((ns - 1) * k_fold + nh - 1)](s.acc + h * dp + i0 * W, s.v + i0 * W, s.ms + h * B, s.w + h * B, nb, dp);
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
      update_sums(s.sum + r_begin * G, s.ms + r_begin * G * B, s.w + r_begin * G * B, H - r_begin * G, (nb_all + 3) & ~3);

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

// The prompt-row attention kernel (prompt_kernel; attention_impl.h, prompt_tile), written once
// over a lanes type V and compiled per ISA by attention_prompt_avx512.cpp (16 lanes) and
// attention_avx2.cpp (8), each of which defines V.
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
  static constexpr bool k_interleaves_regs = requires(const vec* r, float* o) {
    V::template interleave_regs<P>(r, o);
  };

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
        case 1:
          fold<1>(acc + c0, w, alpha, vb + c0, nb, dp);
          break;
        case 2:
          fold<2>(acc + c0, w, alpha, vb + c0, nb, dp);
          break;
        case 3:
          fold<3>(acc + c0, w, alpha, vb + c0, nb, dp);
          break;
        case 4:
          fold<4>(acc + c0, w, alpha, vb + c0, nb, dp);
          break;
        case 5:
          fold<5>(acc + c0, w, alpha, vb + c0, nb, dp);
          break;
        case 6:
          fold<6>(acc + c0, w, alpha, vb + c0, nb, dp);
          break;
        case 7:
          fold<7>(acc + c0, w, alpha, vb + c0, nb, dp);
          break;
        default:
          fold<8>(acc + c0, w, alpha, vb + c0, nb, dp);
          break;
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
  static void fold_lanes(float* acc, const int* lane, const float* w, const float* alpha, const prompt_tile& t, int64_t t0, int nb, int h) {
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
          case 1:
            fold_lanes<C, 1>(acc, lane, w, alpha, t, t0, nb, h);
            break;
          case 2:
            if constexpr (G >= 2) fold_lanes<C, 2>(acc, lane, w, alpha, t, t0, nb, h);
            break;
          case 3:
            if constexpr (G >= 3) fold_lanes<C, 3>(acc, lane, w, alpha, t, t0, nb, h);
            break;
          default:
            if constexpr (G >= 4) fold_lanes<C, 4>(acc, lane, w, alpha, t, t0, nb, h);
            break;
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
    return V::k_fold_from_cache && t.n_rows == 1 && t.head_dim == t.padded_dim && t.padded_dim % L == 0 && t.padded_dim <= 8 * L;
  }

  static void fold_row_any(float* acc, const float* w, const float* alpha, const prompt_tile& t, int P, int64_t t0, int nb) {
    switch (t.padded_dim / L) {
      case 1:
        return fold_row_block<1>(acc, w, alpha, t, P, t0, nb);
      case 2:
        return fold_row_block<2>(acc, w, alpha, t, P, t0, nb);
      case 3:
        return fold_row_block<3>(acc, w, alpha, t, P, t0, nb);
      case 4:
        return fold_row_block<4>(acc, w, alpha, t, P, t0, nb);
      case 5:
        return fold_row_block<5>(acc, w, alpha, t, P, t0, nb);
      case 6:
        return fold_row_block<6>(acc, w, alpha, t, P, t0, nb);
      case 7:
        return fold_row_block<7>(acc, w, alpha, t, P, t0, nb);
      default:
        return fold_row_block<8>(acc, w, alpha, t, P, t0, nb);
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
      case 4:
        return attend_tile<4>(t, scratch);
      case 2:
        return attend_tile<2>(t, scratch);
      default:
        return attend_tile<1>(t, scratch);
    }
  }
};

}  // namespace
}  // namespace tandem::kernels::cpu
