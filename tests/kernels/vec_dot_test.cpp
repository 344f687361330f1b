#include "kernels/cpu/vec_dot.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <stdexcept>
#include <utility>
#include <vector>

#include "kernels/cpu/act_quant.h"
#include "kernels/cpu/blocks.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quants.h"
#include "tests/kernels/kernel_test_util.h"

using namespace tandem::kernels;
using namespace tandem::kernels::cpu;

namespace {

// k_max_weight_rows weight rows and k_max_act_rows activation rows, with the exact
// dequantized values the kernels see and the yardsticks to judge them by (per pair o, r at
// index r * k_max_weight_rows + o).
struct dot_case {
  weight_type wt;
  weight_type act;
  int64_t n;
  std::vector<uint8_t> w;  // k_max_weight_rows quantized weight rows
  size_t w_row;
  std::vector<uint8_t> a;  // k_max_act_rows converted activation rows
  size_t a_row;
  std::vector<double> expected;   // sum of dequantized weight * dequantized activation, in double
  std::vector<double> magnitude;  // sum of |terms| (plus |m * s| per block for Q4_1 / Q5_1)
  std::vector<double> s_slack;    // Q4_1/Q5_1: sum |m| * |s - d * sum(q)| (fp16 rounding of s)
};

bool has_offset(weight_type t) { return t == weight_type::q4_1 || t == weight_type::q5_1; }

dot_case make_case(weight_type wt, int64_t n, uint32_t seed) {
  dot_case c{wt, activation_type(wt), n, {}, 0, {}, 0, {}, {}, {}};
  const auto wf = tandem::test::gaussian(static_cast<size_t>(n * k_max_weight_rows), seed, 0.05f, 0.01f);
  c.w = tandem::test::quantize_matrix(wt, wf, k_max_weight_rows, n);
  c.w_row = static_cast<size_t>(row_bytes(wt, n));
  const auto wd = tandem::test::dequantize_matrix(wt, c.w, k_max_weight_rows, n);
  c.a_row = static_cast<size_t>(row_bytes(c.act, n));
  c.a.resize(c.a_row * k_max_act_rows);
  for (int r = 0; r < k_max_act_rows; ++r) {
    const auto xf = tandem::test::gaussian(static_cast<size_t>(n), seed * 31 + static_cast<uint32_t>(r) + 1, 1.0f);
    uint8_t* ar = c.a.data() + c.a_row * static_cast<size_t>(r);
    quantize_activation_row(c.act, xf.data(), ar, n);
    std::vector<float> ad(static_cast<size_t>(n));
    dequantize_activation_row(c.act, ar, ad.data(), n);
    for (int o = 0; o < k_max_weight_rows; ++o) {
      const float* wo = wd.data() + static_cast<size_t>(o * n);
      double sum = 0, mag = 0, slack = 0;
      for (int64_t i = 0; i < n; ++i) {
        sum += static_cast<double>(wo[i]) * ad[static_cast<size_t>(i)];
        mag += std::fabs(static_cast<double>(wo[i]) * ad[static_cast<size_t>(i)]);
      }
      if (has_offset(wt)) {
        // The kernel uses m * s with s = fp16(d * sum(q)); the dequantized sum uses m * d * sum(q).
        const size_t wb = wt == weight_type::q4_1 ? sizeof(block_q4_1) : sizeof(block_q5_1);
        for (int64_t b = 0; b < n / 32; ++b) {
          half_bytes m;
          std::memcpy(m, c.w.data() + c.w_row * static_cast<size_t>(o) + static_cast<size_t>(b) * wb + 2, 2);  // m follows d
          const auto* y = reinterpret_cast<const block_q8_1*>(ar) + b;
          int q = 0;
          for (int j = 0; j < 32; ++j) q += y->qs[j];
          const double mf = fp16_to_fp32(load_half(m)), s = fp16_to_fp32(load_half(y->s));
          slack += std::fabs(mf) * std::fabs(s - static_cast<double>(fp16_to_fp32(load_half(y->d))) * q);
          mag += std::fabs(mf * s);
        }
      }
      c.expected.push_back(sum);
      c.magnitude.push_back(mag);
      c.s_slack.push_back(slack);
    }
  }
  return c;
}

// Output stride: one more than the tile width, so the untouched gap column shows overruns.
constexpr int64_t k_out_stride = k_max_weight_rows + 1;

std::vector<float> run(const dot_case& c, dot_fn fn, int n_w, int n_act) {
  std::vector<float> out(static_cast<size_t>(k_max_act_rows * k_out_stride), -1.0f);
  fn(c.n, c.w.data(), c.w_row, n_w, c.a.data(), c.a_row, n_act, out.data(), k_out_stride);
  return out;
}

float at(const std::vector<float>& out, int o, int r) { return out[static_cast<size_t>(r * k_out_stride + o)]; }
size_t pair(int o, int r) { return static_cast<size_t>(r * k_max_weight_rows + o); }

// Row lengths per type: one block, odd block counts (paths that take two blocks per register
// must handle the last one alone), and a real FFN width. F32/F16/BF16 also get lengths that
// are not a multiple of any SIMD width.
std::vector<int64_t> lengths_for(weight_type t) {
  if (info(t).block_elems == 256) return {256, 512, 768, 2816};
  if (info(t).block_elems == 1) return {1, 7, 37, 64, 100, 256, 2816};
  return {32, 64, 96, 160, 256, 2816};
}

// The SIMD paths this CPU can run, with the kernel each selects for t.
std::vector<std::pair<isa, dot_fn>> simd_paths(weight_type t) {
  std::vector<std::pair<isa, dot_fn>> out;
  for (const isa p : {isa::avx2, isa::avx512})
    if (isa_supported(p)) out.emplace_back(p, select_dot(find_dot_kernel(t), p));
  return out;
}

// Compares a kernel with the scalar reference on one case and tile shape: within 1e-5 of the
// sum of |terms| inside the tile, untouched outside it.
void check_against_scalar(const dot_case& c, dot_fn fn, int n_w, int n_act) {
  const auto s = run(c, find_dot_kernel(c.wt).scalar, n_w, n_act);
  const auto v = run(c, fn, n_w, n_act);
  for (int r = 0; r < k_max_act_rows; ++r)
    for (int o = 0; o < k_out_stride; ++o) {
      CAPTURE(r);
      CAPTURE(o);
      if (r >= n_act || o >= n_w) {
        REQUIRE(at(v, o, r) == -1.0f);
        continue;
      }
      CHECK(std::fabs(static_cast<double>(at(v, o, r)) - at(s, o, r)) <= 1e-5 * c.magnitude[pair(o, r)]);
    }
}

}  // namespace

TEST_SUITE("vec_dot") {
  TEST_CASE("kernel table matches the activation types") {
    for (const auto t : tandem::test::computable_types()) {
      CAPTURE(display_name(t));
      const dot_kernel& k = find_dot_kernel(t);
      CHECK(k.act == activation_type(t));
      CHECK(static_cast<bool>(k.scalar));
      CHECK(static_cast<bool>(k.avx2));
      CHECK((select_dot(k, isa::scalar) == k.scalar));
      CHECK((select_dot(k, isa::avx2) == k.avx2));
      CHECK(static_cast<bool>(select_dot(k, isa::avx512)));
    }
    CHECK_THROWS_WITH_AS(find_dot_kernel(weight_type::q2_k), doctest::Contains("supported: F32"), std::invalid_argument);
  }

  TEST_CASE("hand-built Q4_0 x Q8_0 block") {
    block_q4_0 w;
    store_half(w.d, 0x4000);                                                     // 2
    for (int j = 0; j < 16; ++j) w.qs[j] = static_cast<uint8_t>(j | (15 << 4));  // codes j-8, then 7
    block_q8_0 a;
    store_half(a.d, 0x3800);  // 0.5
    for (int j = 0; j < 32; ++j) a.qs[j] = static_cast<int8_t>(j < 16 ? 1 : -2);
    // sum (j-8) * 1 over j<16 = -8; 16 * 7 * -2 = -224; total -232 * 2 * 0.5
    float out = 0;
    vec_dot_q4_0_scalar(32, &w, &a, sizeof a, 1, &out, 1);
    CHECK(out == -232.0f);
    if (isa_supported(isa::avx2)) {
      vec_dot_q4_0_avx2(32, &w, &a, sizeof a, 1, &out, 1);
      CHECK(out == -232.0f);
    }
  }

  TEST_CASE("scalar dot equals the dot of the dequantized rows") {
    // Tolerance: 1e-5 of the sum of |terms| (float accumulation), plus the fp16 rounding of
    // Q8_1's s for Q4_1/Q5_1, which the kernel uses and the dequantized rows do not.
    uint32_t seed = 100;
    for (const auto t : tandem::test::computable_types()) {
      for (const int64_t n : lengths_for(t)) {
        CAPTURE(display_name(t));
        CAPTURE(n);
        const auto c = make_case(t, n, ++seed);
        const auto out = run(c, find_dot_kernel(t).scalar, k_max_weight_rows, k_max_act_rows);
        for (int r = 0; r < k_max_act_rows; ++r)
          for (int o = 0; o < k_max_weight_rows; ++o) {
            CAPTURE(r);
            CAPTURE(o);
            CHECK(std::fabs(at(out, o, r) - c.expected[pair(o, r)]) <= 1e-5 * c.magnitude[pair(o, r)] + c.s_slack[pair(o, r)] * 1.001);
          }
      }
    }
  }

  TEST_CASE("every SIMD path equals the scalar dot, for every tile shape") {
    // All paths sum the same integers per block; only the float accumulation order differs
    // (and, for BF16 on AVX-512 BF16, the products' accumulation inside vdpbf16ps), so they
    // agree to 1e-5 of the sum of |terms|.
    uint32_t seed = 200;
    for (const auto t : tandem::test::computable_types()) {
      const auto paths = simd_paths(t);
      if (paths.empty()) {
        MESSAGE("skipped: this CPU lacks AVX2/FMA/F16C");
        return;
      }
      for (const int64_t n : lengths_for(t)) {
        const auto c = make_case(t, n, ++seed);
        const dot_kernel& k = find_dot_kernel(t);
        for (const auto& [path, fn] : paths)
          for (int n_w = 1; n_w <= k_max_weight_rows; ++n_w)
            for (int n_act = 1; n_act <= k_max_act_rows; ++n_act) {
              CAPTURE(display_name(t));
              CAPTURE(isa_name(path));
              CAPTURE(n);
              CAPTURE(n_w);
              CAPTURE(n_act);
              const auto s = run(c, k.scalar, n_w, n_act);
              const auto v = run(c, fn, n_w, n_act);
              for (int r = 0; r < k_max_act_rows; ++r)
                for (int o = 0; o < k_out_stride; ++o) {
                  CAPTURE(r);
                  CAPTURE(o);
                  if (r >= n_act || o >= n_w) {
                    REQUIRE(at(v, o, r) == -1.0f);  // outside the tile: untouched
                    continue;
                  }
                  CHECK(std::fabs(static_cast<double>(at(v, o, r)) - at(s, o, r)) <= 1e-5 * c.magnitude[pair(o, r)]);
                }
            }
      }
    }
  }

  TEST_CASE("a tile equals single-pair calls bit for bit") {
    // matmul splits rows into tiles by thread count and batch size; a result must not depend
    // on which tile position computed it.
    uint32_t seed = 300;
    for (const auto t : tandem::test::computable_types()) {
      const auto c = make_case(t, 512, ++seed);
      const dot_kernel& k = find_dot_kernel(t);
      std::vector<std::pair<isa, dot_fn>> paths{{isa::scalar, k.scalar}};
      for (const auto& p : simd_paths(t)) paths.push_back(p);
      for (const auto& [path, fn] : paths) {
        CAPTURE(display_name(t));
        CAPTURE(isa_name(path));
        const auto all = run(c, fn, k_max_weight_rows, k_max_act_rows);
        for (int r = 0; r < k_max_act_rows; ++r)
          for (int o = 0; o < k_max_weight_rows; ++o) {
            float one = 0;
            fn(c.n, c.w.data() + c.w_row * static_cast<size_t>(o), c.w_row, 1, c.a.data() + c.a_row * static_cast<size_t>(r), c.a_row, 1, &one, 1);
            CHECK(one == at(all, o, r));
          }
      }
    }
  }
  TEST_CASE("SIMD paths handle every block count of the 32-element types") {
    // The AVX-512 kernels take blocks in pairs / quads and convert scales 16 blocks at a time;
    // every remainder of those, alone and after full groups, must match the scalar sum.
    uint32_t seed = 400;
    for (const auto t : {weight_type::q4_0, weight_type::q4_1, weight_type::q5_0, weight_type::q5_1, weight_type::q8_0}) {
      for (int64_t blocks = 1; blocks <= 41; ++blocks) {
        const auto c = make_case(t, blocks * 32, ++seed);
        for (const auto& [path, fn] : simd_paths(t))
          for (const auto& [n_w, n_act] : {std::pair{1, 1}, std::pair{4, 1}, std::pair{3, 2}, std::pair{4, 4}}) {
            CAPTURE(display_name(t));
            CAPTURE(isa_name(path));
            CAPTURE(blocks);
            CAPTURE(n_w);
            CAPTURE(n_act);
            check_against_scalar(c, fn, n_w, n_act);
          }
      }
    }
  }

  TEST_CASE("avx512 legacy tiles equal the avx2 tiles bit for bit") {
    // The AVX2 tiles keep ggml's order of float operations, which decides SmolLM2's greedy
    // tokens at near-tied logits; the AVX-512 tiles must round exactly as they do, for every
    // block count and wherever a pair sits in a tile.
    if (!isa_supported(isa::avx512)) {
      MESSAGE("skipped: this CPU lacks AVX-512 VNNI");
      return;
    }
    uint32_t seed = 600;
    for (const auto t : {weight_type::q4_0, weight_type::q4_1, weight_type::q5_0, weight_type::q5_1, weight_type::q8_0}) {
      const dot_kernel& k = find_dot_kernel(t);
      REQUIRE(static_cast<bool>(k.avx512));
      REQUIRE((select_dot(k, isa::avx512) == k.avx512));
      for (int64_t blocks = 1; blocks <= 41; ++blocks) {
        const auto c = make_case(t, blocks * 32, ++seed);
        for (int n_w = 1; n_w <= k_max_weight_rows; ++n_w)
          for (int n_act = 1; n_act <= k_max_act_rows; ++n_act) {
            CAPTURE(display_name(t));
            CAPTURE(blocks);
            CAPTURE(n_w);
            CAPTURE(n_act);
            const auto wide = run(c, k.avx512, n_w, n_act);
            const auto narrow = run(c, k.avx2, n_w, n_act);
            // Compared as bytes: equal values are not enough (the sign of a zero counts).
            CHECK(std::memcmp(wide.data(), narrow.data(), wide.size() * sizeof(float)) == 0);
          }
      }
    }
  }

  TEST_CASE("SIMD paths handle every tail length of the float types") {
    uint32_t seed = 500;
    for (const auto t : {weight_type::f32, weight_type::f16, weight_type::bf16})
      for (int64_t n = 1; n <= 80; ++n) {
        const auto c = make_case(t, n, ++seed);
        for (const auto& [path, fn] : simd_paths(t))
          for (const auto& [n_w, n_act] : {std::pair{1, 1}, std::pair{4, 1}, std::pair{4, 4}}) {
            CAPTURE(display_name(t));
            CAPTURE(isa_name(path));
            CAPTURE(n);
            CAPTURE(n_w);
            CAPTURE(n_act);
            check_against_scalar(c, fn, n_w, n_act);
          }
      }
  }

  TEST_CASE("Q8_0 weight code -128 (valid in GGUF files, never made by the quantizer)") {
    // AVX-512 flips the sign bit to get an unsigned byte; -128 becomes 0, and the offset term
    // must still give the exact integer.
    std::vector<block_q8_0> w(3);
    std::vector<block_q8_0> a(3);
    for (size_t b = 0; b < w.size(); ++b) {
      store_half(w[b].d, 0x3C00);  // 1
      store_half(a[b].d, 0x3C00);
      for (int j = 0; j < 32; ++j) {
        w[b].qs[j] = static_cast<int8_t>(j % 3 == 0 ? -128 : j - 16);
        a[b].qs[j] = static_cast<int8_t>(j % 2 ? 127 : -127);
      }
    }
    const int64_t n = 32 * static_cast<int64_t>(w.size());
    float expected = 0;
    vec_dot_q8_0_scalar(n, w.data(), a.data(), 0, 1, &expected, 1);
    double exact = 0;
    for (size_t b = 0; b < w.size(); ++b)
      for (int j = 0; j < 32; ++j) exact += static_cast<double>(w[b].qs[j]) * a[b].qs[j];
    CHECK(expected == static_cast<float>(exact));
    for (const auto& [path, fn] : simd_paths(weight_type::q8_0)) {
      CAPTURE(isa_name(path));
      float out = 0;
      fn(n, w.data(), 0, 1, a.data(), 0, 1, &out, 1);
      CHECK(out == expected);  // small integers: every order of additions is exact
    }
  }

#if defined(__unix__)
  TEST_CASE("kernels read nothing past the last weight row and activation row") {
    // Weight rows and activation rows are views into files and scratch buffers; the tile's
    // last rows may end at the last byte of a mapping.
    uint32_t seed = 600;
    for (const auto t : tandem::test::computable_types()) {
      const int64_t block = std::max(info(t).block_elems, info(activation_type(t)).block_elems);
      for (const int64_t n : {block, 3 * block, 7 * block}) {
        const auto c = make_case(t, n, ++seed);
        tandem::test::guarded_bytes w(c.w.size());
        tandem::test::guarded_bytes a(c.a.size());
        std::memcpy(w.data(), c.w.data(), c.w.size());
        std::memcpy(a.data(), c.a.data(), c.a.size());
        const dot_kernel& k = find_dot_kernel(t);
        std::vector<std::pair<isa, dot_fn>> paths{{isa::scalar, k.scalar}};
        for (const auto& p : simd_paths(t)) paths.push_back(p);
        for (const auto& [path, fn] : paths) {
          CAPTURE(display_name(t));
          CAPTURE(isa_name(path));
          CAPTURE(n);
          std::vector<float> out(static_cast<size_t>(k_max_act_rows * k_out_stride), -1.0f);
          fn(n, w.data(), c.w_row, k_max_weight_rows, a.data(), c.a_row, k_max_act_rows, out.data(), k_out_stride);
          const auto ref = run(c, fn, k_max_weight_rows, k_max_act_rows);
          CHECK(out == ref);
        }
      }
    }
  }
#endif
}

// Hand-built K-quant blocks at the edges of their ranges against hand-built Q8_K blocks,
// including activation codes of -128 (which Q8_K quantization never produces but a kernel
// must still take exactly): the AVX-512 tiles are checked against the integer formula of the
// format, the scalar reference against the same, and the dequantizer against the codes the
// test wrote, so the expectations rest on the block layout and nothing else.
namespace {

constexpr int k_blocks = 3;
constexpr int64_t k_n = k_blocks * k_qk_k;

// The code and scale values one weight row was built from, per block.
struct row_codes {
  std::vector<int> q;          // k_n codes, unsigned (0..15 / 0..31 / 0..63)
  std::vector<int> sc;         // per block: 8 (Q4_K/Q5_K) or 16 (Q6_K) sub-block scales
  std::vector<int> m;          // per block: 8 mins (Q4_K/Q5_K)
  std::vector<float> d, dmin;  // per block
};

// fp16 bit patterns of d / dmin values that keep every product exact.
constexpr uint16_t k_halves[] = {0x3C00 /* 1 */, 0x3800 /* 0.5 */, 0x4000 /* 2 */, 0x3400 /* 0.25 */};
float half_value(uint16_t h) { return fp16_to_fp32(h); }

// Inverse of unpack_k_scale: sc / m 0..3 in the low 6 bits of bytes 0-3 / 4-7; sc / m 4..7
// split into low nibbles in bytes 8-11 and top 2 bits in bits 6-7 of bytes 0-3 / 4-7.
void pack_scales(const int* sc, const int* m, uint8_t* out) {
  for (int j = 0; j < 4; ++j) {
    out[j] = static_cast<uint8_t>(sc[j] | ((sc[j + 4] >> 4) << 6));
    out[j + 4] = static_cast<uint8_t>(m[j] | ((m[j + 4] >> 4) << 6));
    out[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | ((m[j + 4] & 0xF) << 4));
  }
}

// Element e of a block: 64-element chunk c, lane l, upper half of the chunk or not.
void set_affine_code(uint8_t* qs, uint8_t* qh, int e, int q) {
  const int c = e / 64, l = e % 32, upper = (e % 64) / 32;
  uint8_t& byte = qs[32 * c + l];
  byte = static_cast<uint8_t>(upper ? (byte & 0x0F) | ((q & 0xF) << 4) : (byte & 0xF0) | (q & 0xF));
  if (qh) {
    const int bit = 2 * c + upper;
    qh[l] = static_cast<uint8_t>((qh[l] & ~(1 << bit)) | (((q >> 4) & 1) << bit));
  }
}

// Q6_K element e: half h, lane l, quarter k (elements l, l + 32, l + 64, l + 96 of the half).
void set_q6_code(block_q6_k& b, int e, int q) {
  const int h = e / 128, k = (e % 128) / 32, l = e % 32;
  uint8_t& low = b.ql[64 * h + l + (k & 1) * 32];
  low = static_cast<uint8_t>(k < 2 ? (low & 0xF0) | (q & 0xF) : (low & 0x0F) | ((q & 0xF) << 4));
  uint8_t& high = b.qh[32 * h + l];
  high = static_cast<uint8_t>((high & ~(3 << (2 * k))) | (((q >> 4) & 3) << (2 * k)));
}

// Weight row `kind` (0..3): 0 every code and scale at its maximum; 1 maximum codes, Q6_K
// scales -128 and no mins; 2 zero codes with mixed scales; 3 seeded random everything.
row_codes make_codes(weight_type t, int kind, uint32_t seed) {
  const int code_max = t == weight_type::q4_k ? 15 : t == weight_type::q5_k ? 31 : 63;
  const int n_sc = t == weight_type::q6_k ? 16 : 8;
  std::mt19937 rng(seed);
  row_codes r;
  for (int64_t i = 0; i < k_n; ++i) r.q.push_back(kind == 3 ? static_cast<int>(rng() % (code_max + 1)) : kind == 2 ? 0 : code_max);
  for (int b = 0; b < k_blocks; ++b) {
    for (int j = 0; j < n_sc; ++j) {
      int sc = 0;
      if (t == weight_type::q6_k)
        sc = kind == 0 ? 127 : kind == 1 ? -128 : kind == 2 ? (j % 2 ? 127 : -128) : static_cast<int>(rng() % 256) - 128;
      else
        sc = kind == 2 ? (j * 9) % 64 : kind == 3 ? static_cast<int>(rng() % 64) : 63;
      r.sc.push_back(sc);
      if (t != weight_type::q6_k) r.m.push_back(kind == 1 ? 0 : kind == 3 ? static_cast<int>(rng() % 64) : 63 - j);
    }
    r.d.push_back(half_value(k_halves[(b + kind) % 4]));
    r.dmin.push_back(half_value(k_halves[(b + kind + 1) % 4]));
  }
  return r;
}

uint16_t find_half(float v) {
  for (const uint16_t h : k_halves)
    if (half_value(h) == v) return h;
  return 0;
}

std::vector<uint8_t> build_row(weight_type t, const row_codes& r) {
  std::vector<uint8_t> out(static_cast<size_t>(row_bytes(t, k_n)), 0);
  for (int b = 0; b < k_blocks; ++b) {
    const int* q = r.q.data() + b * k_qk_k;
    if (t == weight_type::q6_k) {
      auto& blk = reinterpret_cast<block_q6_k*>(out.data())[b];
      for (int e = 0; e < k_qk_k; ++e) set_q6_code(blk, e, q[e]);
      for (int s = 0; s < 16; ++s) blk.scales[s] = static_cast<int8_t>(r.sc[16 * b + s]);
      store_half(blk.d, find_half(r.d[b]));
    } else if (t == weight_type::q5_k) {
      auto& blk = reinterpret_cast<block_q5_k*>(out.data())[b];
      for (int e = 0; e < k_qk_k; ++e) set_affine_code(blk.qs, blk.qh, e, q[e]);
      pack_scales(&r.sc[8 * b], &r.m[8 * b], blk.scales);
      store_half(blk.d, find_half(r.d[b]));
      store_half(blk.dmin, find_half(r.dmin[b]));
    } else {
      auto& blk = reinterpret_cast<block_q4_k*>(out.data())[b];
      for (int e = 0; e < k_qk_k; ++e) set_affine_code(blk.qs, nullptr, e, q[e]);
      pack_scales(&r.sc[8 * b], &r.m[8 * b], blk.scales);
      store_half(blk.d, find_half(r.d[b]));
      store_half(blk.dmin, find_half(r.dmin[b]));
    }
  }
  return out;
}

// The value element i decodes to, from the codes (the format's definition).
double element_value(weight_type t, const row_codes& r, int64_t i) {
  const int64_t b = i / k_qk_k;
  if (t == weight_type::q6_k) return static_cast<double>(r.d[b]) * r.sc[16 * b + (i % k_qk_k) / 16] * (r.q[i] - 32);
  const int j = static_cast<int>((i % k_qk_k) / 32);
  return static_cast<double>(r.d[b]) * r.sc[8 * b + j] * r.q[i] - static_cast<double>(r.dmin[b]) * r.m[8 * b + j];
}

// Bound on the magnitude of element i's contribution through either integer sum a kernel
// keeps per block (the code part and the min part are scaled and summed separately).
double element_magnitude(weight_type t, const row_codes& r, int64_t i) {
  const int64_t b = i / k_qk_k;
  if (t == weight_type::q6_k) return std::fabs(static_cast<double>(r.d[b]) * r.sc[16 * b + (i % k_qk_k) / 16]) * 64;
  const int j = static_cast<int>((i % k_qk_k) / 32);
  return static_cast<double>(r.d[b]) * r.sc[8 * b + j] * r.q[i] + static_cast<double>(r.dmin[b]) * r.m[8 * b + j];
}

// Activation row `kind` (0..3): all -128, all +127, alternating +127 / -128, seeded random.
std::vector<block_q8_k> make_act(int kind, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<block_q8_k> a(k_blocks);
  for (int b = 0; b < k_blocks; ++b) {
    a[b].d = kind == 1 ? 0.25f : b == 1 ? 0.5f : 1.0f;
    for (int i = 0; i < k_qk_k; ++i) {
      const int v = kind == 0 ? -128 : kind == 1 ? 127 : kind == 2 ? (i % 2 ? -128 : 127) : static_cast<int>(rng() % 256) - 128;
      a[b].qs[i] = static_cast<int8_t>(v);
    }
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int i = 0; i < 16; ++i) s += a[b].qs[16 * g + i];
      a[b].bsums[g] = static_cast<int16_t>(s);
    }
  }
  return a;
}

dot_fn avx512_kernel(weight_type t) { return t == weight_type::q4_k ? dot_q4_k_avx512 : t == weight_type::q5_k ? dot_q5_k_avx512 : dot_q6_k_avx512; }

}  // namespace

TEST_SUITE("vec_dot_k_avx512") {
  TEST_CASE("the table's avx512 column holds the K-quant tiles") {
    for (const auto t : {weight_type::q4_k, weight_type::q5_k, weight_type::q6_k}) {
      CAPTURE(display_name(t));
      CHECK((find_dot_kernel(t).avx512 == avx512_kernel(t)));
    }
  }

  TEST_CASE("edge codes, scales and activations match the format's integer formula") {
    if (!isa_supported(isa::avx512)) {
      MESSAGE("skipped: this CPU lacks AVX-512 VNNI");
      return;
    }
    for (const auto t : {weight_type::q4_k, weight_type::q5_k, weight_type::q6_k}) {
      CAPTURE(display_name(t));
      const size_t w_row = static_cast<size_t>(row_bytes(t, k_n));
      std::vector<row_codes> codes;
      std::vector<uint8_t> w;
      for (int o = 0; o < k_max_weight_rows; ++o) {
        codes.push_back(make_codes(t, o, 7 + static_cast<uint32_t>(o)));
        const auto row = build_row(t, codes.back());
        // The test's writers follow the layout the library decodes.
        std::vector<float> decoded(static_cast<size_t>(k_n));
        dequantize_row(t, row.data(), decoded.data(), k_n);
        for (int64_t i = 0; i < k_n; ++i) REQUIRE(decoded[static_cast<size_t>(i)] == element_value(t, codes.back(), i));
        w.insert(w.end(), row.begin(), row.end());
      }
      std::vector<block_q8_k> act;
      for (int r = 0; r < k_max_act_rows; ++r) {
        const auto a = make_act(r, 11 + static_cast<uint32_t>(r));
        act.insert(act.end(), a.begin(), a.end());
      }
      const size_t a_row = k_blocks * sizeof(block_q8_k);

      float tile[k_max_act_rows][k_max_weight_rows];
      avx512_kernel(t)(k_n, w.data(), w_row, k_max_weight_rows, act.data(), a_row, k_max_act_rows, &tile[0][0], k_max_weight_rows);
      for (int r = 0; r < k_max_act_rows; ++r)
        for (int o = 0; o < k_max_weight_rows; ++o) {
          CAPTURE(r);
          CAPTURE(o);
          double expected = 0, magnitude = 0;
          for (int64_t i = 0; i < k_n; ++i) {
            const block_q8_k& y = act[static_cast<size_t>(r * k_blocks + i / k_qk_k)];
            const double a = static_cast<double>(y.d) * y.qs[i % k_qk_k];
            expected += element_value(t, codes[static_cast<size_t>(o)], i) * a;
            magnitude += element_magnitude(t, codes[static_cast<size_t>(o)], i) * std::fabs(a);
          }
          // The kernels' integers are exact per block; what remains is float rounding of a few
          // per-block terms and their sum, far below what a saturated or lost product costs
          // (at least 4 * 128 * the smallest d * dy here).
          const double tol = 1e-6 * magnitude;
          float scalar = 0;
          find_dot_kernel(t).scalar(k_n, w.data() + w_row * static_cast<size_t>(o), w_row, 1, act.data() + static_cast<size_t>(r * k_blocks), a_row,
                                    1, &scalar, 1);
          CHECK(std::fabs(scalar - expected) <= tol);
          CHECK(std::fabs(tile[r][o] - expected) <= tol);
        }
    }
  }
}
