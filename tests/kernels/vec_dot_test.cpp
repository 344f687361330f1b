#include "kernels/cpu/vec_dot.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "kernels/cpu/act_quant.h"
#include "kernels/cpu/blocks.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/quants.h"
#include "tests/kernels/kernel_test_util.h"

using namespace tandem::kernels;
using namespace tandem::kernels::cpu;

namespace {

// One weight row and k_max_act_rows activation rows, with the exact dequantized values the
// kernels see and the yardsticks to judge them by.
struct dot_case {
  weight_type wt;
  weight_type act;
  int64_t n;
  std::vector<uint8_t> w;  // quantized weight row
  std::vector<uint8_t> a;  // k_max_act_rows converted activation rows
  size_t a_row;
  std::vector<double> expected;   // sum of dequantized weight * dequantized activation, in double
  std::vector<double> magnitude;  // sum of |terms| (plus |m * s| per block for Q4_1 / Q5_1)
  std::vector<double> s_slack;    // Q4_1/Q5_1: sum |m| * |s - d * sum(q)| (fp16 rounding of s)
};

bool has_offset(weight_type t) { return t == weight_type::q4_1 || t == weight_type::q5_1; }

dot_case make_case(weight_type wt, int64_t n, uint32_t seed) {
  dot_case c{wt, activation_type(wt), n, {}, {}, 0, {}, {}, {}};
  const auto wf = tandem::test::gaussian(static_cast<size_t>(n), seed, 0.05f, 0.01f);
  c.w = tandem::test::quantize_matrix(wt, wf, 1, n);
  const auto wd = tandem::test::dequantize_matrix(wt, c.w, 1, n);
  c.a_row = static_cast<size_t>(row_bytes(c.act, n));
  c.a.resize(c.a_row * k_max_act_rows);
  for (int r = 0; r < k_max_act_rows; ++r) {
    const auto xf = tandem::test::gaussian(static_cast<size_t>(n), seed * 31 + static_cast<uint32_t>(r) + 1, 1.0f);
    uint8_t* ar = c.a.data() + c.a_row * static_cast<size_t>(r);
    quantize_activation_row(c.act, xf.data(), ar, n);
    std::vector<float> ad(static_cast<size_t>(n));
    dequantize_activation_row(c.act, ar, ad.data(), n);
    double sum = 0, mag = 0, slack = 0;
    for (int64_t i = 0; i < n; ++i) {
      sum += static_cast<double>(wd[static_cast<size_t>(i)]) * ad[static_cast<size_t>(i)];
      mag += std::fabs(static_cast<double>(wd[static_cast<size_t>(i)]) * ad[static_cast<size_t>(i)]);
    }
    if (has_offset(wt)) {
      // The kernel uses m * s with s = fp16(d * sum(q)); the dequantized sum uses m * d * sum(q).
      const size_t wb = wt == weight_type::q4_1 ? sizeof(block_q4_1) : sizeof(block_q5_1);
      for (int64_t b = 0; b < n / 32; ++b) {
        half_bytes m;
        std::memcpy(m, c.w.data() + static_cast<size_t>(b) * wb + 2, 2);  // m follows d in both
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
  return c;
}

std::vector<float> run(const dot_case& c, vec_dot_fn fn, int n_act) {
  std::vector<float> out(static_cast<size_t>(n_act) * 3, -1.0f);
  fn(c.n, c.w.data(), c.a.data(), c.a_row, n_act, out.data(), 3);  // stride 3: rows interleave
  return out;
}

std::vector<int64_t> lengths_for(weight_type t) {
  if (info(t).block_elems == 256) return {256, 512, 2816};
  if (info(t).block_elems == 1) return {37, 64, 256, 2816};  // 37: the SIMD tail path
  return {32, 64, 256, 2816};
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
    }
    CHECK_THROWS_WITH_AS(find_dot_kernel(weight_type::q2_k), doctest::Contains("supported: F32"),
                         std::invalid_argument);
  }

  TEST_CASE("hand-built Q4_0 x Q8_0 block") {
    block_q4_0 w;
    store_half(w.d, 0x4000);  // 2
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
        const auto out = run(c, find_dot_kernel(t).scalar, k_max_act_rows);
        for (int r = 0; r < k_max_act_rows; ++r) {
          CAPTURE(r);
          const double got = out[static_cast<size_t>(r) * 3];
          CHECK(std::fabs(got - c.expected[r]) <= 1e-5 * c.magnitude[r] + c.s_slack[r] * 1.001);
        }
      }
    }
  }

  TEST_CASE("avx2 dot equals scalar dot") {
    if (!isa_supported(isa::avx2)) {
      MESSAGE("skipped: this CPU lacks AVX2/FMA/F16C");
      return;
    }
    // Both sum the same integers per block; only the float accumulation order differs, so
    // they agree to 1e-5 of the sum of |terms|.
    uint32_t seed = 200;
    for (const auto t : tandem::test::computable_types()) {
      for (const int64_t n : lengths_for(t)) {
        const auto c = make_case(t, n, ++seed);
        const dot_kernel& k = find_dot_kernel(t);
        for (int n_act = 1; n_act <= k_max_act_rows; ++n_act) {
          CAPTURE(display_name(t));
          CAPTURE(n);
          CAPTURE(n_act);
          const auto s = run(c, k.scalar, n_act);
          const auto v = run(c, k.avx2, n_act);
          for (int r = 0; r < n_act; ++r) {
            CAPTURE(r);
            CHECK(std::fabs(static_cast<double>(v[static_cast<size_t>(r) * 3]) - s[static_cast<size_t>(r) * 3]) <=
                  1e-5 * c.magnitude[r]);
          }
        }
      }
    }
  }

  TEST_CASE("a multi-row call equals single-row calls bit for bit") {
    uint32_t seed = 300;
    for (const auto t : tandem::test::computable_types()) {
      const auto c = make_case(t, 512, ++seed);
      const dot_kernel& k = find_dot_kernel(t);
      for (const vec_dot_fn fn : {k.scalar, isa_supported(isa::avx2) ? k.avx2 : k.scalar}) {
        CAPTURE(display_name(t));
        const auto all = run(c, fn, k_max_act_rows);
        for (int r = 0; r < k_max_act_rows; ++r) {
          float one = 0;
          fn(c.n, c.w.data(), c.a.data() + c.a_row * static_cast<size_t>(r), c.a_row, 1, &one, 1);
          CHECK(one == all[static_cast<size_t>(r) * 3]);
        }
        // Untouched gaps between the strided outputs.
        CHECK(all[1] == -1.0f);
        CHECK(all[2] == -1.0f);
      }
    }
  }
}
