#include "kernels/cpu/panel.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/act_quant.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/packed.h"
#include "kernels/cpu/vec_dot.h"
#include "tests/kernels/kernel_test_util.h"

using namespace tandem::kernels;
using namespace tandem::kernels::cpu;

namespace {

const std::vector<weight_type>& panel_types() {
  static const std::vector<weight_type> types{weight_type::q4_0, weight_type::q4_1, weight_type::q5_0, weight_type::q5_1,
                                              weight_type::q8_0, weight_type::q4_k, weight_type::q5_k, weight_type::q6_k};
  return types;
}

// A 64-byte aligned byte buffer (the panel kernels use aligned loads).
struct aligned_bytes {
  explicit aligned_bytes(size_t n, uint8_t fill = 0) : raw(n + 64, fill) {
    const auto p = reinterpret_cast<uintptr_t>(raw.data());
    data = raw.data() + (64 - p % 64) % 64;
  }
  std::vector<uint8_t> raw;
  uint8_t* data;
};

struct case_data {
  weight_type wt;
  int64_t cols;
  int n_rows, n_act;
  std::vector<uint8_t> w;  // n_rows weight rows
  std::vector<float> wd;   // dequantized
  std::vector<uint8_t> a;  // n_act converted activation rows
  std::vector<float> ad;   // dequantized activations
  size_t w_row, a_row;
};

case_data make_case(weight_type wt, int64_t cols, int n_rows, int n_act, uint32_t seed) {
  case_data c{wt, cols, n_rows, n_act, {}, {}, {}, {}, 0, 0};
  c.w_row = static_cast<size_t>(row_bytes(wt, cols));
  const auto wf = tandem::test::gaussian(static_cast<size_t>(cols * n_rows), seed, 0.05f, 0.01f);
  c.w = tandem::test::quantize_matrix(wt, wf, n_rows, cols);
  c.wd = tandem::test::dequantize_matrix(wt, c.w, n_rows, cols);
  const weight_type at = activation_type(wt);
  c.a_row = static_cast<size_t>(row_bytes(at, cols));
  c.a.resize(c.a_row * static_cast<size_t>(n_act) + 4);
  c.ad.resize(static_cast<size_t>(cols * n_act));
  const auto x = tandem::test::gaussian(static_cast<size_t>(cols * n_act), seed + 1, 1.0f);
  for (int r = 0; r < n_act; ++r) {
    quantize_activation_row(at, x.data() + r * cols, c.a.data() + r * c.a_row, cols);
    dequantize_activation_row(at, c.a.data() + r * c.a_row, c.ad.data() + r * cols, cols);
  }
  return c;
}

// Exact dot of the dequantized rows (what the panel computes up to float rounding), and a
// bound of its rounding error: 1e-5 of the sum of |w*a|, plus for Q4_1 / Q5_1 the fp16
// rounding of the activation blocks' stored d * sum (ggml's Q8_1, which carries the weights'
// offset term): 2^-11 of the sum of |min * a|.
void reference(const case_data& c, int r, int o, double& dot, double& tol) {
  dot = 0;
  double mag = 0, offset = 0;
  const int sub = panel_sub_elems(c.wt);
  std::vector<uint8_t> codes(static_cast<size_t>(c.cols));
  std::vector<float> scale(static_cast<size_t>(c.cols / sub)), min(scale.size());
  panel_decode_row(c.wt, c.w.data() + o * c.w_row, c.cols, codes.data(), scale.data(), min.data());
  for (int64_t i = 0; i < c.cols; ++i) {
    const double a = c.ad[static_cast<size_t>(r * c.cols + i)];
    const double p = static_cast<double>(c.wd[static_cast<size_t>(o * c.cols + i)]) * a;
    dot += p;
    mag += std::fabs(p);
    offset += std::fabs(min[static_cast<size_t>(i / sub)] * a);
  }
  const bool q8_1 = activation_type(c.wt) == weight_type::q8_1;
  tol = 1e-5 * mag + (q8_1 ? offset / 2048.0 : 0.0) + 1e-6;
}

std::vector<int64_t> col_counts(weight_type wt) {
  if (info(wt).block_elems == 256) return {256, 768};
  return {32, 96, 288};
}

}  // namespace

TEST_CASE("panel_decode_row reproduces the dequantized weights as scale * code + min") {
  for (const weight_type wt : panel_types()) {
    CAPTURE(display_name(wt));
    const case_data c = make_case(wt, 512, 1, 1, 3);
    const int sub = panel_sub_elems(wt);
    std::vector<uint8_t> codes(512);
    std::vector<float> scale(static_cast<size_t>(512 / sub)), min(static_cast<size_t>(512 / sub));
    panel_decode_row(wt, c.w.data(), 512, codes.data(), scale.data(), min.data());
    for (int64_t i = 0; i < 512; ++i) {
      const float v = scale[static_cast<size_t>(i / sub)] * codes[static_cast<size_t>(i)] + min[static_cast<size_t>(i / sub)];
      CHECK(v == doctest::Approx(c.wd[static_cast<size_t>(i)]).epsilon(1e-5).scale(1e-3));
    }
  }
}

TEST_CASE("panel_dot_ref matches the exact dot of the dequantized rows for every type and shape") {
  for (const weight_type wt : panel_types()) {
    for (const int64_t cols : col_counts(wt)) {
      for (const int n_rows : {1, 7, 16}) {
        CAPTURE(display_name(wt));
        CAPTURE(cols);
        CAPTURE(n_rows);
        const int n_act = 3;
        const case_data c = make_case(wt, cols, n_rows, n_act, static_cast<uint32_t>(cols + n_rows));
        aligned_bytes panel(panel_bytes(wt, cols));
        pack_panel_ref(wt, c.w.data(), c.w_row, n_rows, cols, panel.data);
        std::vector<int8_t> codes(panel_act_code_bytes(cols, n_act));
        std::vector<float> aux(panel_act_aux_floats(wt, cols, n_act));
        panel_acts(wt, c.a.data(), c.a_row, n_act, cols, codes.data(), aux.data());
        const int64_t stride = 17;
        std::vector<float> out(static_cast<size_t>(stride * n_act), -7.0f);
        panel_dot_ref(wt, panel.data, cols, codes.data(), aux.data(), n_act, out.data(), stride, n_rows);
        for (int r = 0; r < n_act; ++r) {
          for (int o = 0; o < stride; ++o) {
            const float got = out[static_cast<size_t>(r * stride + o)];
            if (o >= n_rows) {
              CHECK(got == -7.0f);  // outside the tile: untouched
              continue;
            }
            double dot, tol;
            reference(c, r, o, dot, tol);
            CHECK(std::fabs(got - dot) <= tol);
          }
        }
      }
    }
  }
}

TEST_CASE("pack_panel_avx512 writes the bytes of pack_panel_ref, and panel_dot_avx512 its results") {
  if (!isa_supported(isa::avx512)) return;
  for (const weight_type wt : panel_types()) {
    for (const int64_t cols : col_counts(wt)) {
      for (const int n_rows : {1, 5, 16}) {
        CAPTURE(display_name(wt));
        CAPTURE(cols);
        CAPTURE(n_rows);
        const int max_act = k_panel_max_act_rows;
        const case_data c = make_case(wt, cols, n_rows, max_act, static_cast<uint32_t>(7 * cols + n_rows));
        aligned_bytes ref(panel_bytes(wt, cols)), fast(panel_bytes(wt, cols), 0xAB);
        pack_panel_ref(wt, c.w.data(), c.w_row, n_rows, cols, ref.data);
        pack_panel_avx512(wt, c.w.data(), c.w_row, n_rows, cols, fast.data);
        CHECK(std::memcmp(ref.data, fast.data, panel_bytes(wt, cols)) == 0);

        std::vector<int8_t> codes(panel_act_code_bytes(cols, max_act));
        std::vector<float> aux(panel_act_aux_floats(wt, cols, max_act));
        panel_acts(wt, c.a.data(), c.a_row, max_act, cols, codes.data(), aux.data());
        for (int n_act = 1; n_act <= max_act; ++n_act) {
          const int64_t stride = 19;
          std::vector<float> want(static_cast<size_t>(stride * n_act), -7.0f), got(want);
          panel_dot_ref(wt, ref.data, cols, codes.data(), aux.data(), n_act, want.data(), stride, n_rows);
          panel_dot_avx512(wt, fast.data, cols, codes.data(), aux.data(), n_act, got.data(), stride, n_rows);
          for (int r = 0; r < n_act; ++r) {
            for (int o = 0; o < stride; ++o) {
              const size_t i = static_cast<size_t>(r * stride + o);
              if (o >= n_rows) {
                CHECK(got[i] == -7.0f);
                continue;
              }
              double dot, tol;
              reference(c, r, o, dot, tol);
              CHECK(std::fabs(got[i] - want[i]) <= tol);
            }
          }
        }
      }
    }
  }
}

TEST_CASE("panel_dot_amx over a signed panel gives panel_dot_avx512's bits for every row count") {
  if (!cpu_has_amx()) {
    MESSAGE("skipped: this CPU (or its operating system) offers no AMX-INT8");
    return;
  }
  for (const weight_type wt : panel_types()) {
    CHECK(panel_amx_supported(wt) == (wt != weight_type::q4_1 && wt != weight_type::q5_1 && wt != weight_type::q6_k));
    if (!panel_amx_supported(wt)) continue;
    for (const int64_t cols : col_counts(wt)) {
      for (const int n_rows : {1, 5, 16}) {
        CAPTURE(display_name(wt));
        CAPTURE(cols);
        CAPTURE(n_rows);
        const int max_act = 37;  // two passes of 16 and one of 5 (its own tile shape)
        const case_data c = make_case(wt, cols, n_rows, max_act, static_cast<uint32_t>(11 * cols + n_rows));
        aligned_bytes plain(panel_bytes(wt, cols)), sign(panel_bytes(wt, cols));
        pack_panel_avx512(wt, c.w.data(), c.w_row, n_rows, cols, plain.data);
        std::memcpy(sign.data, plain.data, panel_bytes(wt, cols));
        panel_sign_codes(wt, sign.data, cols);
        if (panel_code_offset(wt) == 0) CHECK(std::memcmp(sign.data, plain.data, panel_bytes(wt, cols)) == 0);
        std::vector<int8_t> codes(panel_act_code_bytes(cols, max_act));
        std::vector<float> aux(panel_act_aux_floats(wt, cols, max_act));
        panel_acts(wt, c.a.data(), c.a_row, max_act, cols, codes.data(), aux.data());
        const auto aux_row = static_cast<int64_t>(panel_act_aux_floats(wt, cols, 1));
        for (const int n_act : {1, 7, 16, 19, 32, 37}) {
          CAPTURE(n_act);
          const int64_t stride = 21;
          std::vector<float> want(static_cast<size_t>(stride * n_act), -7.0f), got(want);
          for (int r0 = 0; r0 < n_act; r0 += k_panel_max_act_rows)
            panel_dot_avx512(wt, plain.data, cols, codes.data() + r0 * cols, aux.data() + r0 * aux_row, std::min(k_panel_max_act_rows, n_act - r0),
                             want.data() + r0 * stride, stride, n_rows);
          panel_dot_amx(wt, sign.data, cols, codes.data(), aux.data(), n_act, got.data(), stride, n_rows);
          CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);  // -7 past n_rows too
        }
      }
    }
  }
}

TEST_CASE("panel_act_row writes what quantize_activation_row and panel_acts write, on every path") {
  tandem::test::isa_guard guard;
  for (const isa path : tandem::test::supported_isas()) {
    set_isa(path);
    for (const weight_type wt : panel_types()) {
      const weight_type at = activation_type(wt);
      // Legacy types: 16 blocks at a time on AVX-512, then the last 1-15 as a group with empty lanes.
      const std::vector<int64_t> widths =
          info(wt).block_elems == 256 ? std::vector<int64_t>{256, 768} : std::vector<int64_t>{32, 288, 576, 768, 1056};
      for (const int64_t cols : widths) {
        CAPTURE(static_cast<int>(path));
        CAPTURE(display_name(wt));
        CAPTURE(cols);
        auto x = tandem::test::gaussian(static_cast<size_t>(cols), static_cast<uint32_t>(cols) + 3, 2.0f);
        // A block of zeros, one whose largest magnitude is negative and repeated (Q8_K keeps the
        // first), and a tie at the quantizer's rounding point.
        std::fill(x.begin(), x.begin() + 32, 0.0f);
        for (int64_t at0 = 32; at0 + 32 <= cols; at0 += 320) {
          x[static_cast<size_t>(at0 + 8)] = -9.0f;
          x[static_cast<size_t>(at0 + 18)] = 9.0f;
          x[static_cast<size_t>(at0 + 20)] = -9.0f;
          x[static_cast<size_t>(at0 + 1)] = 9.0f * 0.5f / 127.0f;
        }
        if (cols >= 512) std::fill(x.begin() + 480, x.begin() + 512, 0.0f);  // a zero block inside a run of 16
        std::vector<uint8_t> row(static_cast<size_t>(row_bytes(at, cols)));
        quantize_activation_row(at, x.data(), row.data(), cols);
        std::vector<int8_t> want_codes(static_cast<size_t>(cols)), got_codes(static_cast<size_t>(cols), 0x55);
        std::vector<float> want_aux(panel_act_aux_floats(wt, cols, 1)), got_aux(want_aux.size(), -1.0f);
        panel_acts(wt, row.data(), row.size(), 1, cols, want_codes.data(), want_aux.data());
        panel_act_row(wt, x.data(), cols, got_codes.data(), got_aux.data());
        CHECK(got_codes == want_codes);
        CHECK(std::memcmp(got_aux.data(), want_aux.data(), want_aux.size() * sizeof(float)) == 0);
      }
    }
  }
  std::vector<float> x(48);
  std::vector<int8_t> codes(48);
  std::vector<float> aux(8);
  CHECK_THROWS_WITH_AS(panel_act_row(weight_type::q4_0, x.data(), 48, codes.data(), aux.data()), doctest::Contains("48 columns"),
                       std::invalid_argument);
  CHECK_THROWS_WITH_AS(panel_act_row(weight_type::f16, x.data(), 32, codes.data(), aux.data()), doctest::Contains("F16"), std::invalid_argument);
}

TEST_CASE("tiled_act_row writes what panel_act_row and tile_packed_act_row write, on every path") {
  tandem::test::isa_guard guard;
  for (const isa path : tandem::test::supported_isas()) {
    set_isa(path);
    for (const weight_type wt : panel_types()) {
      // Legacy types: 16 blocks at a time on AVX-512, then the last 2 as a group with empty lanes.
      const int64_t cols = info(wt).block_elems == 256 ? 768 : 576;
      const auto aux_per_row = static_cast<int64_t>(panel_act_aux_floats(wt, cols, 1));
      for (const int n_group : {1, 3, 8, 16}) {
        CAPTURE(static_cast<int>(path));
        CAPTURE(display_name(wt));
        CAPTURE(n_group);
        auto x = tandem::test::gaussian(static_cast<size_t>(n_group * cols), static_cast<uint32_t>(n_group) + 11, 2.0f);
        if (n_group > 1) std::fill(x.begin() + cols, x.begin() + cols + 256, 0.0f);  // zero blocks in row 1 (a Q8_K block of 256 too)
        std::vector<int8_t> codes(static_cast<size_t>(cols));
        std::vector<float> aux(static_cast<size_t>(aux_per_row));
        std::vector<int8_t> want_codes(static_cast<size_t>(n_group * cols), 0x55), got_codes(want_codes);
        std::vector<float> want_aux(static_cast<size_t>(n_group * aux_per_row), -1.0f), got_aux(want_aux);
        for (int r = 0; r < n_group; ++r) {
          panel_act_row(wt, x.data() + r * cols, cols, codes.data(), aux.data());
          tile_packed_act_row(wt, cols, codes.data(), aux.data(), r, n_group, want_codes.data(), want_aux.data());
          tiled_act_row(wt, x.data() + r * cols, cols, r, n_group, got_codes.data(), got_aux.data());
        }
        CHECK(got_codes == want_codes);
        CHECK(std::memcmp(got_aux.data(), want_aux.data(), want_aux.size() * sizeof(float)) == 0);
      }
    }
  }
  std::vector<float> x(48);
  std::vector<int8_t> codes(48);
  std::vector<float> aux(8);
  CHECK_THROWS_WITH_AS(tiled_act_row(weight_type::q4_0, x.data(), 48, 0, 1, codes.data(), aux.data()), doctest::Contains("48 columns"),
                       std::invalid_argument);
}

TEST_CASE("panel helpers reject types without a panel form") {
  CHECK_FALSE(panel_supported(weight_type::f16));
  CHECK(panel_bytes(weight_type::f32, 256) == 0);
  std::vector<uint8_t> row(1024);
  std::vector<uint8_t> codes(256);
  float s[16], m[16];
  CHECK_THROWS_WITH_AS(panel_decode_row(weight_type::bf16, row.data(), 256, codes.data(), s, m), doctest::Contains("BF16"), std::invalid_argument);
}

TEST_CASE("Q4_1 and Q5_1 panels equal the row tiles bit for bit (ggml's float order)") {
  if (!isa_supported(isa::avx512)) return;
  for (const weight_type wt : {weight_type::q4_1, weight_type::q5_1}) {
    for (const int64_t cols : {32, 96, 288}) {
      for (const int n_rows : {1, 5, 16}) {
        CAPTURE(display_name(wt));
        CAPTURE(cols);
        CAPTURE(n_rows);
        const int n_act = 5;
        const case_data c = make_case(wt, cols, n_rows, n_act, static_cast<uint32_t>(11 * cols + n_rows));
        aligned_bytes panel(panel_bytes(wt, cols));
        pack_panel_avx512(wt, c.w.data(), c.w_row, n_rows, cols, panel.data);
        std::vector<int8_t> codes(panel_act_code_bytes(cols, n_act));
        std::vector<float> aux(panel_act_aux_floats(wt, cols, n_act));
        panel_acts(wt, c.a.data(), c.a_row, n_act, cols, codes.data(), aux.data());
        std::vector<float> got(static_cast<size_t>(16 * n_act), -7.0f);
        panel_dot_avx512(wt, panel.data, cols, codes.data(), aux.data(), n_act, got.data(), 16, n_rows);
        const dot_fn tile = wt == weight_type::q4_1 ? dot_q4_1_avx512 : dot_q5_1_avx512;
        for (int r = 0; r < n_act; ++r) {
          for (int o = 0; o < n_rows; ++o) {
            float want = 0;
            tile(cols, c.w.data() + o * c.w_row, c.w_row, 1, c.a.data() + r * c.a_row, c.a_row, 1, &want, 1);
            CHECK(got[static_cast<size_t>(r * 16 + o)] == want);
          }
        }
      }
    }
  }
}
