#include "kernels/cpu/packed.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/act_quant.h"
#include "kernels/cpu/blocks.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/panel.h"
#include "kernels/cpu/vec_dot.h"
#include "tests/kernels/kernel_test_util.h"

using namespace tandem::kernels;
using namespace tandem::kernels::cpu;

namespace {

const std::vector<weight_type>& packed_types() {
  static const std::vector<weight_type> types{weight_type::q4_0, weight_type::q4_1, weight_type::q5_0, weight_type::q5_1,
                                              weight_type::q8_0, weight_type::q4_k, weight_type::q5_k, weight_type::q6_k};
  return types;
}

std::vector<int64_t> col_counts(weight_type wt) {
  if (info(wt).block_elems == 256) return {256, 768};
  return {32, 96, 288};
}

struct matrix {
  weight_type wt;
  int64_t rows, cols;
  std::vector<uint8_t> w;       // GGUF rows
  std::vector<float> wd;        // dequantized
  std::vector<uint8_t> packed;  // pack_weights
};

matrix make_matrix(weight_type wt, int64_t rows, int64_t cols, uint32_t seed) {
  matrix m{wt, rows, cols, {}, {}, {}};
  const auto wf = tandem::test::gaussian(static_cast<size_t>(rows * cols), seed, 0.05f, 0.01f);
  m.w = tandem::test::quantize_matrix(wt, wf, rows, cols);
  m.wd = tandem::test::dequantize_matrix(wt, m.w, rows, cols);
  m.packed.assign(packed_bytes(wt, rows, cols), 0xCD);
  pack_weights(wt, m.w.data(), rows, cols, m.packed.data());
  return m;
}

struct acts {
  std::vector<uint8_t> converted;  // activation_type rows
  std::vector<float> ad;           // their dequantized values
  std::vector<int8_t> codes;
  std::vector<float> aux;
  size_t a_row = 0;
};

acts make_acts(weight_type wt, int64_t cols, int n, uint32_t seed) {
  acts a;
  const weight_type at = activation_type(wt);
  a.a_row = static_cast<size_t>(row_bytes(at, cols));
  a.converted.resize(a.a_row * static_cast<size_t>(n) + 4);
  a.ad.resize(static_cast<size_t>(cols * n));
  const auto x = tandem::test::gaussian(static_cast<size_t>(cols * n), seed, 1.0f);
  for (int r = 0; r < n; ++r) {
    quantize_activation_row(at, x.data() + r * cols, a.converted.data() + r * a.a_row, cols);
    dequantize_activation_row(at, a.converted.data() + r * a.a_row, a.ad.data() + r * cols, cols);
  }
  a.codes.resize(panel_act_code_bytes(cols, n));
  a.aux.resize(panel_act_aux_floats(wt, cols, n));
  panel_acts(wt, a.converted.data(), a.a_row, n, cols, a.codes.data(), a.aux.data());
  return a;
}

// |got - exact| bound as in panel_test.cpp: 1e-5 of sum |w * a|, plus for Q4_1/Q5_1 the fp16
// rounding of Q8_1's stored s (2^-11 of sum |m * a|, with |m| <= the block's largest |w|).
void check_dot(const matrix& m, const acts& a, int64_t o, int r, float got) {
  double dot = 0, mag = 0, offset = 0;
  for (int64_t b = 0; b < m.cols; b += 32) {
    double wmax = 0;
    for (int64_t i = b; i < b + 32; ++i) wmax = std::max(wmax, std::fabs(static_cast<double>(m.wd[static_cast<size_t>(o * m.cols + i)])));
    for (int64_t i = b; i < b + 32; ++i) {
      const double x = a.ad[static_cast<size_t>(r * m.cols + i)];
      const double p = m.wd[static_cast<size_t>(o * m.cols + i)] * x;
      dot += p;
      mag += std::fabs(p);
      offset += wmax * std::fabs(x);
    }
  }
  const double tol = 1e-5 * mag + (has_ggml_order(m.wt) ? offset / 2048.0 : 0.0) + 1e-6;
  CHECK(std::fabs(got - dot) <= tol);
}

// f(wt, order, cols) for every packed type, both orders of Q4_1/Q5_1 (one of the others), and
// the column counts of col_counts, each captured for a failure's report.
template <class F>
void each_type_order_cols(F&& f) {
  for (const weight_type wt : packed_types()) {
    for (const sum_order order : {sum_order::ggml, sum_order::tile}) {
      if (order == sum_order::tile && !has_ggml_order(wt)) continue;
      for (const int64_t cols : col_counts(wt)) {
        CAPTURE(display_name(wt));
        CAPTURE(cols);
        CAPTURE(order == sum_order::tile);
        f(wt, order, cols);
      }
    }
  }
}

}  // namespace

TEST_CASE("the AVX2 near request distance: Zen 3's for Q4_0 on AMD family 19h only") {
  const cpu_identity zen2{true, 0x17u, 0x31u}, zen3{true, 0x19u, 0x01u}, intel{false, 6u, 0x97u};
  CHECK(packed_near_ahead_avx2_for(weight_type::q4_0, zen3) == k_packed_q4_0_near_ahead_zen3);
  CHECK(packed_near_ahead_avx2_for(weight_type::q8_0, zen3) == k_packed_near_ahead_avx2);
  CHECK(packed_near_ahead_avx2_for(weight_type::q4_1, zen3) == k_packed_near_ahead_avx2);
  CHECK(packed_near_ahead_avx2_for(weight_type::q4_0, zen2) == k_packed_near_ahead_avx2);
  CHECK(packed_near_ahead_avx2_for(weight_type::q4_0, intel) == k_packed_near_ahead_avx2);
  // This process's choice is the one for this CPU.
  CHECK(packed_near_ahead_avx2(weight_type::q4_0) == packed_near_ahead_avx2_for(weight_type::q4_0, this_cpu()));
  CHECK(packed_near_ahead_avx2(weight_type::q8_0) == k_packed_near_ahead_avx2);
}

TEST_CASE("AVX-512 requests: none for front-to-back decode streams on AMD only, both levels elsewhere; passes of several rows by type") {
  const cpu_identity zen4{true, 0x19u, 0x61u}, xeon{false, 6u, 0xA7u};
  CHECK(streams_prefetch_themselves(zen4));
  CHECK_FALSE(streams_prefetch_themselves(xeon));
  using req = avx512_requests;
  const auto on = [](const cpu_identity& cpu, weight_type wt, int rows, sum_order order = sum_order::tile) {
    return packed_avx512_requests(wt, rows, order, streams_prefetch_themselves(cpu));
  };
  // Zen 4, as measured there.
  CHECK(on(zen4, weight_type::q4_0, 1) == req::none);
  CHECK(on(zen4, weight_type::q8_0, 1) == req::none);
  CHECK(on(zen4, weight_type::q4_1, 1, sum_order::ggml) == req::none);
  CHECK(on(zen4, weight_type::q4_1, 1) == req::l1);
  CHECK(on(zen4, weight_type::q5_0, 1) == req::l1);
  CHECK(on(zen4, weight_type::q5_k, 1) == req::l1);
  CHECK(on(zen4, weight_type::q4_k, 1) == req::l2_and_l1);
  CHECK(on(zen4, weight_type::q6_k, 1) == req::l2_and_l1);
  // Elsewhere every decode stream asks at both levels.
  for (const weight_type wt : {weight_type::q4_0, weight_type::q4_1, weight_type::q5_0, weight_type::q5_1, weight_type::q8_0, weight_type::q4_k,
                               weight_type::q5_k, weight_type::q6_k}) {
    CAPTURE(display_name(wt));
    CHECK(on(xeon, wt, 1) == req::l2_and_l1);
    CHECK(on(xeon, wt, 1, sum_order::ggml) == req::l2_and_l1);
    // Passes of several rows ask once, into L1, on AMD; elsewhere at both levels, except
    // Q4_K and the types with a min in either order.
    const bool near_only = wt == weight_type::q4_k || wt == weight_type::q4_1 || wt == weight_type::q5_1;
    for (const int rows : {2, 8, 16}) {
      CHECK(on(zen4, wt, rows) == req::l1);
      CHECK(on(xeon, wt, rows) == (near_only ? req::l1 : req::l2_and_l1));
      CHECK(on(xeon, wt, rows, sum_order::ggml) == (near_only ? req::l1 : req::l2_and_l1));
    }
  }
  // The AVX2 decode passes: one near request for the front-to-back streams on AMD only.
  CHECK_FALSE(packed_avx2_two_levels(weight_type::q4_0, sum_order::tile, streams_prefetch_themselves(zen4)));
  CHECK_FALSE(packed_avx2_two_levels(weight_type::q8_0, sum_order::tile, streams_prefetch_themselves(zen4)));
  CHECK_FALSE(packed_avx2_two_levels(weight_type::q4_1, sum_order::tile, streams_prefetch_themselves(zen4)));
  CHECK(packed_avx2_two_levels(weight_type::q4_1, sum_order::ggml, streams_prefetch_themselves(zen4)));
  CHECK(packed_avx2_two_levels(weight_type::q4_k, sum_order::tile, streams_prefetch_themselves(zen4)));
  for (const weight_type wt : {weight_type::q4_0, weight_type::q4_1, weight_type::q5_0, weight_type::q5_1, weight_type::q8_0, weight_type::q4_k,
                               weight_type::q5_k, weight_type::q6_k})
    for (const sum_order order : {sum_order::ggml, sum_order::tile}) CHECK(packed_avx2_two_levels(wt, order, streams_prefetch_themselves(xeon)));
  // This process's choice is the one for this CPU.
  CHECK(g_packed_self_streaming == streams_prefetch_themselves(this_cpu()));
  CHECK(packed_avx2_two_levels(weight_type::q4_0, sum_order::tile) ==
        packed_avx2_two_levels(weight_type::q4_0, sum_order::tile, streams_prefetch_themselves(this_cpu())));
  CHECK(packed_avx512_requests(weight_type::q4_0, 1, sum_order::tile) == on(this_cpu(), weight_type::q4_0, 1));
  CHECK(packed_avx512_requests(weight_type::q8_0, 8, sum_order::tile) == on(this_cpu(), weight_type::q8_0, 8));
}

TEST_CASE("AVX-512 tile passes: split sums everywhere on AMD, one sum per row for passes of 8 elsewhere") {
  const cpu_identity zen4{true, 0x19u, 0x61u}, xeon{false, 6u, 0xA7u};
  for (int rows = 2; rows <= 8; ++rows) {
    CAPTURE(rows);
    CHECK(packed_avx512_split_sums(rows, zen4));
    CHECK(packed_avx512_split_sums(rows, xeon) == (rows < 8));
  }
  CHECK(g_packed_split_sums8 == packed_avx512_split_sums(8, this_cpu()));
}

TEST_CASE("packed sizes: the GGUF size for the legacy types and Q6_K, 64 bytes more per 16 x 256 for Q4_K/Q5_K") {
  for (const weight_type wt : {weight_type::q4_0, weight_type::q4_1, weight_type::q5_0, weight_type::q5_1, weight_type::q8_0, weight_type::q6_k})
    CHECK(packed_bytes(wt, 32, 512) == static_cast<size_t>(32 * row_bytes(wt, 512)));
  for (const weight_type wt : {weight_type::q4_k, weight_type::q5_k})
    CHECK(packed_bytes(wt, 32, 512) == static_cast<size_t>(32 * row_bytes(wt, 512)) + 2 * 2 * 64);
  // The last panel is padded to 16 rows.
  CHECK(packed_bytes(weight_type::q4_0, 17, 64) == 2 * packed_panel_bytes(weight_type::q4_0, 64));
  CHECK_FALSE(packable(weight_type::q3_k));
  CHECK_FALSE(packable(weight_type::f16));
  std::vector<uint8_t> buf(1024);
  CHECK_THROWS_AS(pack_weights(weight_type::q2_k, buf.data(), 1, 256, buf.data()), std::invalid_argument);
}

TEST_CASE("dequantize_packed_row gives the GGUF row's values exactly") {
  for (const weight_type wt : packed_types()) {
    for (const int64_t cols : col_counts(wt)) {
      CAPTURE(display_name(wt));
      CAPTURE(cols);
      const matrix m = make_matrix(wt, 37, cols, static_cast<uint32_t>(cols + 5));
      std::vector<float> row(static_cast<size_t>(cols));
      for (int64_t o = 0; o < m.rows; ++o) {
        dequantize_packed_row(wt, m.packed.data(), cols, o, row.data());
        for (int64_t i = 0; i < cols; ++i) REQUIRE(row[static_cast<size_t>(i)] == m.wd[static_cast<size_t>(o * cols + i)]);
      }
    }
  }
}

TEST_CASE("packed products match the exact dot of the dequantized rows, on every path") {
  for (const weight_type wt : packed_types()) {
    for (const int64_t cols : col_counts(wt)) {
      CAPTURE(display_name(wt));
      CAPTURE(cols);
      const int64_t rows = 21;  // one full panel and one of 5 rows
      const matrix m = make_matrix(wt, rows, cols, static_cast<uint32_t>(3 * cols + 1));
      const int n_act = k_packed_max_act_rows;
      const acts a = make_acts(wt, cols, n_act, static_cast<uint32_t>(cols + 9));
      const size_t pb = packed_panel_bytes(wt, cols);
      for (int64_t p = 0; p < (rows + 15) / 16; ++p) {
        const int n_w = static_cast<int>(std::min<int64_t>(16, rows - 16 * p));
        for (const int n : {1, 3, k_panel_max_act_rows, 11, n_act}) {
          CAPTURE(n);
          const int64_t stride = 17;
          std::vector<float> ref(static_cast<size_t>(stride * n), -7.0f), fast(ref);
          packed_dot_ref(wt, m.packed.data() + p * pb, cols, a.codes.data(), a.aux.data(), n, ref.data(), stride, n_w);
          if (isa_supported(isa::avx512))
            packed_dot_avx512(wt, m.packed.data() + p * pb, cols, a.codes.data(), a.aux.data(), n, fast.data(), stride, n_w);
          // The AVX2 kernels with and without AVX-VNNI.
          std::vector<float> avx2(ref.size(), -7.0f), vnni(ref.size(), -7.0f);
          if (isa_supported(isa::avx2))
            packed_dot_avx2(wt, m.packed.data() + p * pb, cols, a.codes.data(), a.aux.data(), n, avx2.data(), stride, n_w, sum_order::ggml, false);
          if (cpu_has_avx_vnni())
            packed_dot_avx2(wt, m.packed.data() + p * pb, cols, a.codes.data(), a.aux.data(), n, vnni.data(), stride, n_w, sum_order::ggml, true);
          for (int r = 0; r < n; ++r)
            for (int o = 0; o < stride; ++o) {
              const size_t i = static_cast<size_t>(r * stride + o);
              if (o >= n_w) {
                CHECK(ref[i] == -7.0f);
                if (isa_supported(isa::avx512)) CHECK(fast[i] == -7.0f);
                if (isa_supported(isa::avx2)) CHECK(avx2[i] == -7.0f);
                if (cpu_has_avx_vnni()) CHECK(vnni[i] == -7.0f);
                continue;
              }
              check_dot(m, a, 16 * p + o, r, ref[i]);
              if (isa_supported(isa::avx512)) check_dot(m, a, 16 * p + o, r, fast[i]);
              if (isa_supported(isa::avx2)) check_dot(m, a, 16 * p + o, r, avx2[i]);
              if (cpu_has_avx_vnni()) check_dot(m, a, 16 * p + o, r, vnni[i]);
            }
        }
      }
    }
  }
}

TEST_CASE("a packed product's row has the same bits however many rows share the call") {
  // 16 rows pass over the weights at once with one integer sum per row, fewer in passes of up
  // to 8 with two; integer sums are exact and the float updates run in one order, so no row
  // may tell the difference.
  if (!isa_supported(isa::avx512)) return;
  each_type_order_cols([](weight_type wt, sum_order order, int64_t cols) {
    const matrix m = make_matrix(wt, 16, cols, static_cast<uint32_t>(cols + 31));
    const int n_act = k_packed_max_act_rows;
    const acts a = make_acts(wt, cols, n_act, static_cast<uint32_t>(cols + 41));
    const auto per_row = static_cast<int64_t>(panel_act_aux_floats(wt, cols, 1));
    const int n_w = 14;
    std::vector<float> all(static_cast<size_t>(16 * n_act), -7.0f), eights(all);
    packed_dot_avx512(wt, m.packed.data(), cols, a.codes.data(), a.aux.data(), n_act, all.data(), 16, n_w, order);
    for (int r0 = 0; r0 < n_act; r0 += k_panel_max_act_rows)
      packed_dot_avx512(wt, m.packed.data(), cols, a.codes.data() + r0 * cols, a.aux.data() + r0 * per_row, k_panel_max_act_rows,
                        eights.data() + r0 * 16, 16, n_w, order);
    CHECK(std::memcmp(all.data(), eights.data(), all.size() * sizeof(float)) == 0);
    for (const int r : {0, 5, n_act - 1}) {
      CAPTURE(r);
      std::vector<float> one(16, -7.0f);
      packed_dot_avx512(wt, m.packed.data(), cols, a.codes.data() + r * cols, a.aux.data() + r * per_row, 1, one.data(), 16, n_w, order);
      CHECK(std::memcmp(one.data(), all.data() + r * 16, one.size() * sizeof(float)) == 0);
    }
  });
}

TEST_CASE("packed AVX2 products at the int16 bound: every code at its largest, activations of +-127") {
  // The plain AVX2 kernels add several vpmaddubsw results in int16 before widening (8 for
  // 4-bit codes, 4 for 5-bit, 2 for 6-bit: up to 32004 of 32767 for Q6_K) and multiply Q8_0 as
  // |q| x sign(a, q) (|-128| x 127 twice: 32512). Here every block sits at those bounds, so a
  // sum that wrapped or saturated would show against the integer-exact reference.
  if (!isa_supported(isa::avx2)) return;
  for (const weight_type wt : packed_types()) {
    CAPTURE(display_name(wt));
    const int64_t rows = 16, cols = 512;
    const size_t w_row = static_cast<size_t>(row_bytes(wt, cols));
    // Every code byte 0xFF (nibbles 15, fifth bits set, Q6_K 63; Q8_0 below: -128), scales 1.
    std::vector<uint8_t> w(w_row * rows, 0xFF);
    const size_t bb = static_cast<size_t>(info(wt).block_bytes);
    const uint16_t one = 0x3C00;  // fp16 1.0
    for (size_t b = 0; b < w.size(); b += bb) {
      uint8_t* blk = w.data() + b;
      switch (wt) {
        case weight_type::q8_0:
          std::memset(blk, 0x80, bb);
          std::memcpy(blk, &one, 2);
          break;
        case weight_type::q6_k:
          std::memcpy(blk + offsetof(block_q6_k, d), &one, 2);
          break;
        case weight_type::q4_1:
        case weight_type::q5_1:
        case weight_type::q4_k:
        case weight_type::q5_k:
          std::memcpy(blk, &one, 2);
          std::memcpy(blk + 2, &one, 2);
          break;
        default:
          std::memcpy(blk, &one, 2);
          break;
      }
    }
    std::vector<uint8_t> packed(packed_bytes(wt, rows, cols));
    pack_weights(wt, w.data(), rows, cols, packed.data());
    for (const float sign : {1.0f, -1.0f}) {
      CAPTURE(sign);
      const weight_type at = activation_type(wt);
      const size_t a_row = static_cast<size_t>(row_bytes(at, cols));
      const int n = 5;  // a pass of 4 and one of 1
      std::vector<uint8_t> converted(a_row * n + 4);
      const std::vector<float> x(static_cast<size_t>(cols), sign);
      for (int r = 0; r < n; ++r) quantize_activation_row(at, x.data(), converted.data() + r * a_row, cols);
      std::vector<int8_t> codes(panel_act_code_bytes(cols, n));
      std::vector<float> aux(panel_act_aux_floats(wt, cols, n));
      panel_acts(wt, converted.data(), a_row, n, cols, codes.data(), aux.data());
      REQUIRE(std::abs(static_cast<int>(codes[0])) == 127);  // Q8_K stores -127 for +1
      std::vector<float> ref(static_cast<size_t>(16 * n));
      packed_dot_ref(wt, packed.data(), cols, codes.data(), aux.data(), n, ref.data(), 16, 16);
      for (const bool vnni : {false, true}) {
        if (vnni && !cpu_has_avx_vnni()) continue;
        CAPTURE(vnni);
        std::vector<float> got(ref.size(), -7.0f);
        packed_dot_avx2(wt, packed.data(), cols, codes.data(), aux.data(), n, got.data(), 16, 16, sum_order::tile, vnni);
        for (size_t i = 0; i < ref.size(); ++i) CHECK(got[i] == doctest::Approx(ref[i]).epsilon(1e-5));
      }
    }
  }
}

TEST_CASE("packed AVX2 products, with and without AVX-VNNI: the AVX-512 kernels' bits in both orders, any row count") {
  // The same integer sums and float steps: a model must compute alike whichever path runs it.
  // Partial panels too: lanes past n_w are left alone.
  if (!isa_supported(isa::avx512) || !isa_supported(isa::avx2)) return;
  each_type_order_cols([](weight_type wt, sum_order order, int64_t cols) {
    const matrix m = make_matrix(wt, 16, cols, static_cast<uint32_t>(cols + 57));
    const acts a = make_acts(wt, cols, 19, static_cast<uint32_t>(cols + 3));
    for (const int n : {1, 2, 3, 4, 5, 8, 16, 19}) {
      for (const int n_w : {16, 9, 8, 3}) {
        CAPTURE(n);
        CAPTURE(n_w);
        std::vector<float> want(static_cast<size_t>(16 * n), -7.0f);
        packed_dot_avx512(wt, m.packed.data(), cols, a.codes.data(), a.aux.data(), n, want.data(), 16, n_w, order);
        for (const bool vnni : {false, true}) {
          if (vnni && !cpu_has_avx_vnni()) continue;
          CAPTURE(vnni);
          std::vector<float> got(want.size(), -7.0f);
          packed_dot_avx2(wt, m.packed.data(), cols, a.codes.data(), a.aux.data(), n, got.data(), 16, n_w, order, vnni);
          if (vnni) REQUIRE(avx_vnni_active());  // else the call above ran the plain kernel
          CHECK(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)) == 0);
        }
      }
    }
  });
}

TEST_CASE("tile_packed_acts lays codes chunk by chunk and aux sub-block by sub-block") {
  for (const weight_type wt : {weight_type::q4_0, weight_type::q6_k}) {
    CAPTURE(display_name(wt));
    const int64_t cols = 512;
    const int n = 5;
    const int sub = panel_sub_elems(wt);
    const auto per_row = static_cast<int64_t>(panel_act_aux_floats(wt, cols, 1));
    std::vector<int8_t> codes(static_cast<size_t>(n * cols));
    std::vector<float> aux(static_cast<size_t>(n * per_row));
    for (size_t i = 0; i < codes.size(); ++i) codes[i] = static_cast<int8_t>(i * 7 + 3);
    for (size_t i = 0; i < aux.size(); ++i) aux[i] = static_cast<float>(i) + 0.5f;
    std::vector<int8_t> tc(codes.size());
    std::vector<float> ta(aux.size());
    tile_packed_acts(wt, cols, codes.data(), aux.data(), n, tc.data(), ta.data());
    for (int r = 0; r < n; ++r) {
      for (int64_t c = 0; c < cols; ++c)
        REQUIRE(tc[static_cast<size_t>(((c / 32) * n + r) * 32 + c % 32)] == codes[static_cast<size_t>(r * cols + c)]);
      for (int64_t s = 0; s < cols / sub; ++s)
        for (int k = 0; k < k_panel_aux_per_sub; ++k)
          REQUIRE(ta[static_cast<size_t>((s * n + r) * k_panel_aux_per_sub + k)] ==
                  aux[static_cast<size_t>(r * per_row + s * k_panel_aux_per_sub + k)]);
    }
    // One row's tiled form is its panel form.
    std::vector<int8_t> one(static_cast<size_t>(cols));
    std::vector<float> one_aux(static_cast<size_t>(per_row));
    tile_packed_acts(wt, cols, codes.data(), aux.data(), 1, one.data(), one_aux.data());
    CHECK(std::equal(one.begin(), one.end(), codes.begin()));
    CHECK(std::equal(one_aux.begin(), one_aux.end(), aux.begin()));
  }
}

TEST_CASE("packed Q4_1 and Q5_1 equal the row tiles of their path bit for bit (ggml's float order)") {
  // path: the packed kernel and the row tiles it must equal (AVX2 with and without AVX-VNNI).
  struct path_case {
    const char* name;
    bool runs;
    void (*packed)(weight_type, const matrix&, const acts&, int, float*);
    dot_fn q4_1, q5_1;
  };
  const path_case paths[] = {
      {"avx512", isa_supported(isa::avx512),
       [](weight_type wt, const matrix& m, const acts& a, int n, float* out) {
         packed_dot_avx512(wt, m.packed.data(), m.cols, a.codes.data(), a.aux.data(), n, out, 16, 16);
       },
       dot_q4_1_avx512, dot_q5_1_avx512},
      {"avx2", isa_supported(isa::avx2),
       [](weight_type wt, const matrix& m, const acts& a, int n, float* out) {
         packed_dot_avx2(wt, m.packed.data(), m.cols, a.codes.data(), a.aux.data(), n, out, 16, 16, sum_order::ggml, false);
       },
       dot_q4_1_avx2, dot_q5_1_avx2},
      {"avxvnni", cpu_has_avx_vnni(),
       [](weight_type wt, const matrix& m, const acts& a, int n, float* out) {
         packed_dot_avx2(wt, m.packed.data(), m.cols, a.codes.data(), a.aux.data(), n, out, 16, 16, sum_order::ggml, true);
       },
       dot_q4_1_avx2, dot_q5_1_avx2},
  };
  for (const path_case& path : paths) {
    if (!path.runs) continue;
    CAPTURE(path.name);
    for (const weight_type wt : {weight_type::q4_1, weight_type::q5_1}) {
      for (const int64_t cols : col_counts(wt)) {
        CAPTURE(display_name(wt));
        CAPTURE(cols);
        const matrix m = make_matrix(wt, 16, cols, static_cast<uint32_t>(cols + 77));
        const int n_act = 3;
        const acts a = make_acts(wt, cols, n_act, 5);
        std::vector<float> got(static_cast<size_t>(16 * n_act));
        path.packed(wt, m, a, n_act, got.data());
        const size_t w_row = static_cast<size_t>(row_bytes(wt, cols));
        for (int r = 0; r < n_act; ++r)
          for (int o = 0; o < 16; ++o) {
            float want = 0;
            (wt == weight_type::q4_1 ? path.q4_1 : path.q5_1)(cols, m.w.data() + o * w_row, w_row, 1, a.converted.data() + r * a.a_row, a.a_row, 1,
                                                              &want, 1);
            CHECK(got[static_cast<size_t>(r * 16 + o)] == want);
          }
      }
    }
  }
}

TEST_CASE("packed Q4_1 and Q5_1 in the tile's order: the exact dot to rounding, each row the same bits in any call") {
  if (!isa_supported(isa::avx512)) return;
  for (const weight_type wt : {weight_type::q4_1, weight_type::q5_1}) {
    for (const int64_t cols : col_counts(wt)) {
      CAPTURE(display_name(wt));
      CAPTURE(cols);
      const matrix m = make_matrix(wt, 16, cols, static_cast<uint32_t>(cols + 91));
      const int n_act = k_panel_max_act_rows;
      const acts a = make_acts(wt, cols, n_act, 17);
      const int n_w = 13;  // a partial panel: lanes past it are left alone
      std::vector<float> all(static_cast<size_t>(16 * n_act), -7.0f);
      packed_dot_avx512(wt, m.packed.data(), cols, a.codes.data(), a.aux.data(), n_act, all.data(), 16, n_w, sum_order::tile);
      const auto per_row = static_cast<int64_t>(panel_act_aux_floats(wt, cols, 1));
      bool differs_from_ggml = false;
      for (int r = 0; r < n_act; ++r) {
        CAPTURE(r);
        std::vector<float> one(16, -7.0f), ggml(16, -7.0f);
        packed_dot_avx512(wt, m.packed.data(), cols, a.codes.data() + r * cols, a.aux.data() + r * per_row, 1, one.data(), 16, n_w, sum_order::tile);
        packed_dot_avx512(wt, m.packed.data(), cols, a.codes.data() + r * cols, a.aux.data() + r * per_row, 1, ggml.data(), 16, n_w);
        for (int o = 0; o < 16; ++o) {
          const float got = all[static_cast<size_t>(r * 16 + o)];
          if (o >= n_w) {
            CHECK(got == -7.0f);
            continue;
          }
          CHECK(std::memcmp(&got, &one[static_cast<size_t>(o)], sizeof got) == 0);
          check_dot(m, a, o, r, got);
          differs_from_ggml = differs_from_ggml || got != ggml[static_cast<size_t>(o)];
        }
      }
      if (cols > 32) CHECK(differs_from_ggml);  // the order flag reached the kernel
    }
  }
}

TEST_CASE("expand_packed_avx512 writes the panel that pack_panel_ref builds from the GGUF rows") {
  if (!isa_supported(isa::avx512)) return;
  for (const weight_type wt : packed_types()) {
    for (const int64_t cols : col_counts(wt)) {
      CAPTURE(display_name(wt));
      CAPTURE(cols);
      const matrix m = make_matrix(wt, 21, cols, static_cast<uint32_t>(cols + 31));
      const size_t bytes = panel_bytes(wt, cols), w_row = static_cast<size_t>(row_bytes(wt, cols));
      std::vector<uint8_t> want_raw(bytes + 64), got_raw(bytes + 64, 0xAB);
      auto aligned = [](std::vector<uint8_t>& v) { return v.data() + (64 - reinterpret_cast<uintptr_t>(v.data()) % 64) % 64; };
      for (int64_t p = 0; p < 2; ++p) {
        const int n = static_cast<int>(std::min<int64_t>(16, m.rows - 16 * p));
        pack_panel_ref(wt, m.w.data() + 16 * p * w_row, w_row, n, cols, aligned(want_raw));
        expand_packed_avx512(wt, m.packed.data() + p * packed_panel_bytes(wt, cols), cols, aligned(got_raw));
        // Codes byte for byte; scales and mins as values (padded rows hold -0 here, +0 there).
        const int sub = panel_sub_elems(wt);
        const size_t sub_bytes = static_cast<size_t>(sub / 4) * 64 + 128;
        for (size_t at = 0; at < bytes; at += sub_bytes) {
          const uint8_t* w8 = aligned(want_raw) + at;
          const uint8_t* g8 = aligned(got_raw) + at;
          CHECK(std::memcmp(w8, g8, sub_bytes - 128) == 0);
          float wf[32], gf[32];
          std::memcpy(wf, w8 + sub_bytes - 128, sizeof wf);
          std::memcpy(gf, g8 + sub_bytes - 128, sizeof gf);
          for (int i = 0; i < 32; ++i) CHECK(wf[i] == gf[i]);
        }
      }
    }
  }
}

#if defined(__unix__)
TEST_CASE("packing reads nothing past the last row (a matrix may end at the end of a mapping)") {
  // GGUF tensors are views into the file mapping; the last tensor ends at the file's end.
  for (const weight_type wt : packed_types()) {
    for (const int64_t cols : col_counts(wt)) {
      CAPTURE(display_name(wt));
      CAPTURE(cols);
      const matrix m = make_matrix(wt, 21, cols, static_cast<uint32_t>(cols + 41));
      tandem::test::guarded_bytes w(m.w.size());
      std::memcpy(w.data(), m.w.data(), m.w.size());
      std::vector<uint8_t> packed(packed_bytes(wt, 21, cols));
      pack_weights(wt, w.data(), 21, cols, packed.data());
      CHECK(packed == m.packed);
      if (isa_supported(isa::avx512)) {
        const size_t w_row = static_cast<size_t>(row_bytes(wt, cols)), bytes = panel_bytes(wt, cols);
        std::vector<uint8_t> raw(bytes + 64);
        uint8_t* panel = raw.data() + (64 - reinterpret_cast<uintptr_t>(raw.data()) % 64) % 64;
        pack_panel_avx512(wt, w.data() + 16 * w_row, w_row, 5, cols, panel);  // the last 5 rows
      }
    }
  }
}
#endif
