// The CUDA weight products (kernels/cuda/ops.h: matvec, cuBLAS gemm, dequantize_f16,
// get_rows) against their CPU twins and double-precision references, for every weight type in
// the CUDA table, on seeded random data over shapes that reach each kernel's edges: row counts
// that are not multiples of a warp or of a block of rows, columns that are not a multiple of
// 32 where the type allows it, several K-quant super-blocks. Every output starts as 0xFF bytes
// (NaN) followed by a guard tail (gpu_test_util.h), so an element a kernel forgets to write,
// or one it writes past the end, shows. Suite "gpu_matmul" runs as CTest's kernels_gpu entry,
// which reports "skipped" (exit 77) where no device answers or the build has no CUDA.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>

#if defined(TANDEM_HAVE_CUDA)

#include "tests/kernels/gpu_test_util.h"

using namespace tandem::test::gpu;

namespace {

// ---- weights × activations -------------------------------------------------------------

// Bounds per weight type for the products.
// matvec_exact, as a fraction of sum_i |W[o, i] x[i]|, against a double-precision product over
// the CPU-dequantized weights and the f32 activations: the CUDA path dequantizes each weight
// in registers to the f32 value cpu::dequantize_row gives (the scale products are exact in
// f32, so at most one rounding differs) and keeps x in f32, so only f32 accumulation differs,
// some hundreds of sequential adds at most (2^-24 each) of partial sums bounded by that sum.
// (Rounding x to f16 instead would cost up to 2^-11 of it: 50 times the bound.)
// The CPU twin converts x first (act_quant.h), so it is further off: by at most
// sum_i |W[o, i]| * e_i, with e_i the worst conversion error of x_i: x_rel * |x_i| for F16 /
// BF16 rows (2^-11 / 2^-8: half an ulp), x_rel * (largest |x| of x_i's block) for the Q8_0
// (32) or Q8_K (256) blocks the quantized types take (half a step of amax/127, and for Q8_0
// the f16 rounding of the block scale). Q4_1 / Q5_1 take Q8_1 blocks, whose f16 sum s carries
// the offset term: up to 2^-9 of max |W| * sum |x| per block more (matmul_test's bound).
// Comparing with the CPU at that bound, plus both accumulations, checks the CPU twin agrees
// without a threshold tuned to these data.
struct product_bounds {
  weight_type t;
  double matvec_exact;
  double x_rel;
  bool x_per_block;
  bool x_block_sum;
};
constexpr product_bounds k_product_bounds[] = {
    {weight_type::f32, 1e-5, 0.0, false, false},    {weight_type::f16, 1e-5, 4.9e-4, false, false}, {weight_type::bf16, 1e-5, 3.91e-3, false, false},
    {weight_type::q8_0, 1e-5, 4.5e-3, true, false}, {weight_type::q4_0, 1e-5, 4.5e-3, true, false}, {weight_type::q4_1, 1e-5, 4.5e-3, true, true},
    {weight_type::q5_0, 1e-5, 4.5e-3, true, false}, {weight_type::q5_1, 1e-5, 4.5e-3, true, true},  {weight_type::q4_k, 1e-5, 4e-3, true, false},
    {weight_type::q5_k, 1e-5, 4e-3, true, false},   {weight_type::q6_k, 1e-5, 4e-3, true, false},
};
// The CPU's own accumulation error, as a fraction of sum_i |W x| (matmul_test's bound).
constexpr double k_cpu_accumulation = 1e-5;

const product_bounds& bounds_of(weight_type t) {
  for (const auto& b : k_product_bounds)
    if (b.t == t) return b;
  FAIL("no bounds for " << display_name(t) << ": add it to k_product_bounds");
  return k_product_bounds[0];
}

// gemm: W dequantized to f16 and x converted to f16 (2^-11 relative each), f32 accumulation:
// |error| <= (2^-10 + 2^-22 + f32 accumulation) * sum_i |W x|, plus the f16 subnormal step
// (2^-25 absolute) for the few weights or activations below 2^-14, covered by 1e-7 per column.
constexpr double k_gemm_rel = 1.1e-3;
constexpr double k_gemm_abs_per_col = 1e-7;

// Activation rows of every test: enough for the largest gemm batch.
constexpr int64_t k_max_x = 64;

std::vector<int64_t> cols_for(weight_type t) {
  const int64_t b = info(t).block_elems;
  if (b == 1) return {37, 64, 1000, 2816};  // 37, 1000: not multiples of 32 (F16/BF16: odd row bytes)
  if (b == 32) return {32, 96, 2816};       // one block, three, 88
  return {256, 768, 2816};                  // one super-block, three, 11
}

// (rows, cols) of the matvec tests: each column count at 1, 7 and 67 rows, then many row
// blocks with a ragged last one.
std::vector<std::pair<int64_t, int64_t>> matvec_shapes(weight_type t) {
  const auto cols_list = cols_for(t);
  std::vector<std::pair<int64_t, int64_t>> shapes;
  for (const int64_t c : cols_list)
    for (const int64_t r : {1, 7, 67}) shapes.push_back({r, c});
  shapes.push_back({1031, cols_list[1]});
  shapes.push_back({259, cols_list.back()});
  return shapes;
}

struct weights {
  weight_type t;
  int64_t rows, cols;
  std::vector<uint8_t> q;  // GGUF rows
  std::vector<float> wd;   // the same dequantized by the CPU
};

weights make_weights(weight_type t, int64_t rows, int64_t cols, uint32_t seed) {
  weights w{t, rows, cols, {}, {}};
  // As tests/kernels/matmul_test.cpp: a small mean, so sums do not cancel to nothing.
  const auto wf = gaussian(size_t(rows * cols), seed, 0.05f, 0.005f);
  w.q = tandem::test::quantize_matrix(t, wf, rows, cols);
  w.wd = tandem::test::dequantize_matrix(t, w.q, rows, cols);
  return w;
}

// Double-precision y = W x over the dequantized weights and the f32 activations, and
// sum_i |W[o, i] x[r, i]| per output (the scale of the accumulation error).
void reference_product(const weights& w, const std::vector<float>& x, int64_t n_x, std::vector<double>& ref, std::vector<double>& mag) {
  ref.assign(size_t(n_x * w.rows), 0.0);
  mag.assign(ref.size(), 0.0);
  for (int64_t r = 0; r < n_x; ++r)
    for (int64_t o = 0; o < w.rows; ++o) {
      double s = 0, m = 0;
      const float* wr = w.wd.data() + o * w.cols;
      const float* xr = x.data() + r * w.cols;
      for (int64_t i = 0; i < w.cols; ++i) {
        const double p = double(wr[i]) * xr[i];
        s += p;
        m += std::fabs(p);
      }
      ref[size_t(r * w.rows + o)] = s;
      mag[size_t(r * w.rows + o)] = m;
    }
}

// Per output: sum_i |W[o, i]| * e_i, the most the CPU's conversion of x (see product_bounds)
// can move it.
std::vector<double> cpu_conversion_bound(const weights& w, const std::vector<float>& x, int64_t n_x, const product_bounds& b) {
  const int64_t block = b.x_per_block ? info(cpu::activation_type(w.t)).block_elems : 1;
  std::vector<double> e(size_t(n_x * w.cols));
  for (size_t i = 0; i < e.size(); i += size_t(block)) {
    double amax = 0;
    for (size_t j = i; j < i + size_t(block); ++j) amax = std::max(amax, std::fabs(double(x[j])));
    for (size_t j = i; j < i + size_t(block); ++j) e[j] = b.x_rel * (b.x_per_block ? amax : std::fabs(double(x[j])));
  }
  std::vector<double> out(size_t(n_x * w.rows), 0.0);
  for (int64_t r = 0; r < n_x; ++r)
    for (int64_t o = 0; o < w.rows; ++o) {
      double s = 0;
      for (int64_t i = 0; i < w.cols; ++i) s += std::fabs(double(w.wd[size_t(o * w.cols + i)])) * e[size_t(r * w.cols + i)];
      if (b.x_block_sum)
        for (int64_t i0 = 0; i0 < w.cols; i0 += 32) {
          double wmax = 0, xsum = 0;
          for (int64_t i = i0; i < i0 + 32; ++i) {
            wmax = std::max(wmax, std::fabs(double(w.wd[size_t(o * w.cols + i)])));
            xsum += std::fabs(double(x[size_t(r * w.cols + i)]));
          }
          s += wmax * xsum * std::ldexp(1.0, -9);
        }
      out[size_t(r * w.rows + o)] = s;
    }
  return out;
}

// matvec_q8 rounds each activation to a step of amax/127 of its 32 (amax over those 32): per
// output, sum_i |W[o, i]| * half a step, with a hair for the f32 scale's own rounding.
constexpr double k_q8_x_rel = 0.5 / 127 * 1.0001;
std::vector<double> q8_conversion_bound(const weights& w, const std::vector<float>& x, int64_t n_x) {
  std::vector<double> e(size_t(n_x * w.cols));
  for (size_t i = 0; i < e.size(); i += 32) {
    double amax = 0;
    for (size_t j = i; j < i + 32; ++j) amax = std::max(amax, std::fabs(double(x[j])));
    for (size_t j = i; j < i + 32; ++j) e[j] = k_q8_x_rel * amax;
  }
  std::vector<double> out(size_t(n_x * w.rows), 0.0);
  for (int64_t r = 0; r < n_x; ++r)
    for (int64_t o = 0; o < w.rows; ++o) {
      double s = 0;
      for (int64_t i = 0; i < w.cols; ++i) s += std::fabs(double(w.wd[size_t(o * w.cols + i)])) * e[size_t(r * w.cols + i)];
      out[size_t(r * w.rows + o)] = s;
    }
  return out;
}

// matvec_q8's own float error beyond the activation rounding, as a fraction of sum_i |W x|:
// per-part integer sums are exact; the scale products and some hundreds of f32 adds remain.
constexpr double k_q8_accumulation = 1e-5;

}  // namespace

TEST_SUITE("gpu_matmul") {
  TEST_CASE("matvec matches a double-precision product and the CPU matmul, every CUDA type") {
    if (!device_or_skip()) return;
    cu::stream s;
    uint32_t seed = 100;
    for (const weight_type t : cuda_types(tandem::kernels::op::matvec)) {
      const auto& b = bounds_of(t);
      double margin_exact = 0, margin_cpu = 0;  // the largest fractions of the bounds used, for the log
      for (const auto& [rows, cols] : matvec_shapes(t)) {
        const weights w = make_weights(t, rows, cols, ++seed);
        const auto x = gaussian(size_t(cu::k_matvec_max_rows * cols), seed + 5000);
        dev_array<uint8_t> dw(w.q, s);
        dev_array<float> dx(x, s);
        for (const int64_t n_x : {1, 3, 8}) {
          CAPTURE(display_name(t));
          CAPTURE(rows);
          CAPTURE(cols);
          CAPTURE(n_x);
          dev_array<float> dy(size_t(n_x * rows), s);
          cu::matvec(t, dw.get(), rows, cols, dx.get(), n_x, dy.get(), s.get());
          const auto y = dy.read();
          std::vector<double> ref, mag;
          reference_product(w, x, n_x, ref, mag);
          double worst = 0;
          for (size_t i = 0; i < y.size(); ++i) worst = std::max(worst, std::fabs(y[i] - ref[i]) / (mag[i] + 1e-30));
          CHECK(worst <= b.matvec_exact);
          margin_exact = std::max(margin_exact, worst / b.matvec_exact);
          std::vector<float> yc(y.size());
          cpu::matmul(t, w.q.data(), rows, cols, x.data(), n_x, yc.data(), nullptr);
          const auto conv = cpu_conversion_bound(w, x, n_x, b);
          double worst_cpu = 0;
          for (size_t i = 0; i < y.size(); ++i)
            worst_cpu = std::max(worst_cpu, std::fabs(double(y[i]) - yc[i]) / (conv[i] + (b.matvec_exact + k_cpu_accumulation) * mag[i] + 1e-30));
          CHECK(worst_cpu <= 1.0);
          margin_cpu = std::max(margin_cpu, worst_cpu);
        }
      }
      MESSAGE("matvec " << display_name(t) << ": " << margin_exact << " of the exact bound, " << margin_cpu << " of the CPU bound");
    }
  }

  TEST_CASE("matvec_q8 (int8 activations, dp4a) is within its activation rounding of the exact product and the CPU's") {
    if (!device_or_skip()) return;
    cu::stream s;
    uint32_t seed = 700;
    int types = 0;
    for (const weight_type t : cuda_types(tandem::kernels::op::matvec)) {
      if (!cu::matvec_q8_supports(t)) continue;
      ++types;
      const auto& b = bounds_of(t);
      double margin_exact = 0, margin_cpu = 0;
      for (const auto& [rows, cols] : matvec_shapes(t)) {
        const weights w = make_weights(t, rows, cols, ++seed);
        const auto x = gaussian(size_t(cu::k_matvec_max_rows * cols), seed + 5000);
        dev_array<uint8_t> dw(w.q, s);
        dev_array<float> dx(x, s);
        for (const int64_t n_x : {1, 3, 8}) {
          CAPTURE(display_name(t));
          CAPTURE(rows);
          CAPTURE(cols);
          CAPTURE(n_x);
          const size_t need = cu::matvec_q8_scratch_bytes(cols, n_x);
          cu::device_buffer scratch(need);
          dev_array<float> dy(size_t(n_x * rows), s);
          cu::matvec_q8(t, dw.get(), rows, cols, dx.get(), n_x, dy.get(), scratch.get(), need, s.get());
          const auto y = dy.read();
          std::vector<double> ref, mag;
          reference_product(w, x, n_x, ref, mag);
          const auto conv = q8_conversion_bound(w, x, n_x);
          double worst = 0;
          for (size_t i = 0; i < y.size(); ++i) worst = std::max(worst, std::fabs(y[i] - ref[i]) / (conv[i] + k_q8_accumulation * mag[i] + 1e-30));
          CHECK(worst <= 1.0);
          margin_exact = std::max(margin_exact, worst);
          // The CPU twin rounds x its own way (act_quant.h): both roundings may add up.
          std::vector<float> yc(y.size());
          cpu::matmul(t, w.q.data(), rows, cols, x.data(), n_x, yc.data(), nullptr);
          const auto conv_cpu = cpu_conversion_bound(w, x, n_x, b);
          double worst_cpu = 0;
          for (size_t i = 0; i < y.size(); ++i)
            worst_cpu = std::max(
                worst_cpu, std::fabs(double(y[i]) - yc[i]) / (conv[i] + conv_cpu[i] + (k_q8_accumulation + k_cpu_accumulation) * mag[i] + 1e-30));
          CHECK(worst_cpu <= 1.0);
          margin_cpu = std::max(margin_cpu, worst_cpu);
          // Each activation row's result does not depend on the others sharing the call.
          if (n_x == 3) {
            dev_array<float> dx1(std::vector<float>(x.begin() + cols, x.begin() + 2 * cols), s);
            dev_array<float> dy1(size_t(rows), s);
            cu::matvec_q8(t, dw.get(), rows, cols, dx1.get(), 1, dy1.get(), scratch.get(), need, s.get());
            const auto y1 = dy1.read();
            CHECK(std::equal(y1.begin(), y1.end(), y.begin() + rows));
          }
        }
      }
      MESSAGE("matvec_q8 " << display_name(t) << ": " << margin_exact << " of its bound, " << margin_cpu << " of the bound against the CPU");
    }
    CHECK(types == 7);

    // One quantize_q8 shared by matrices of different types gives each the bits of its own
    // matvec_q8.
    {
      const int64_t cols = 512, n_x = 5;
      const auto x = gaussian(size_t(n_x * cols), 77);
      dev_array<float> dx(x, s);
      const size_t need = cu::matvec_q8_scratch_bytes(cols, n_x);
      cu::device_buffer shared(need), own(need);
      cu::quantize_q8(dx.get(), n_x, cols, shared.get(), need, s.get());
      uint32_t wseed = 900;
      for (const weight_type t :
           {weight_type::q4_k, weight_type::q6_k, weight_type::q8_0, weight_type::q4_0, weight_type::q4_1, weight_type::q5_0, weight_type::q5_1}) {
        CAPTURE(display_name(t));
        const weights w = make_weights(t, 33, cols, ++wseed);
        dev_array<uint8_t> dw(w.q, s);
        dev_array<float> y_shared(size_t(n_x * 33), s), y_own(size_t(n_x * 33), s);
        cu::matvec_q8_quantized(t, dw.get(), 33, cols, shared.get(), need, n_x, y_shared.get(), s.get());
        cu::matvec_q8(t, dw.get(), 33, cols, dx.get(), n_x, y_own.get(), own.get(), need, s.get());
        const auto a = y_shared.read(), b2 = y_own.read();
        CHECK(std::memcmp(a.data(), b2.data(), a.size() * sizeof(float)) == 0);
      }
    }

    // A NaN activation reaches its row's outputs (as through the f32 matvec), not the others.
    {
      const weights w = make_weights(weight_type::q4_k, 9, 512, 3);
      auto x = gaussian(size_t(2 * 512), 4);
      x[300] = std::nanf("");
      dev_array<uint8_t> dw(w.q, s);
      dev_array<float> dx(x, s);
      dev_array<float> dy(size_t(2 * 9), s);
      const size_t need = cu::matvec_q8_scratch_bytes(512, 2);
      cu::device_buffer scratch(need);
      cu::matvec_q8(weight_type::q4_k, dw.get(), 9, 512, dx.get(), 2, dy.get(), scratch.get(), need, s.get());
      const auto y = dy.read(/*all_written=*/false);  // NaNs expected: check here that each was written
      for (int o = 0; o < 9; ++o) {
        CHECK(std::isnan(y[size_t(o)]));
        CHECK_FALSE(all_ff(y[size_t(o)]));  // the kernel's NaN, not the 0xFF poison
        CHECK(std::isfinite(y[size_t(9 + o)]));
      }
    }

    // Refusals name what is wrong before any work.
    const weights w = make_weights(weight_type::q4_k, 4, 256, 1);
    dev_array<uint8_t> dw(w.q, s);
    dev_array<float> dx(std::vector<float>(256, 1.0f), s);
    dev_array<float> dy(4, s);
    const size_t need = cu::matvec_q8_scratch_bytes(256, 1);
    cu::device_buffer scratch(need);
    CHECK_THROWS_WITH_AS(cu::matvec_q8(weight_type::q4_k, dw.get(), 4, 256, dx.get(), 1, dy.get(), scratch.get(), need - 1, s.get()),
                         doctest::Contains("scratch"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(cu::matvec_q8(weight_type::q5_k, dw.get(), 4, 256, dx.get(), 1, dy.get(), scratch.get(), need, s.get()),
                         doctest::Contains("supported: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(cu::matvec_q8(weight_type::q4_k, dw.get(), 4, 256, dx.get(), 9, dy.get(), scratch.get(), need, s.get()),
                         doctest::Contains("n_x"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(cu::matvec_q8_quantized(weight_type::q4_k, dw.get(), 4, 256, scratch.get(), need, 2, dy.get(), s.get()),
                         doctest::Contains("scratch"), std::invalid_argument);
  }

  TEST_CASE("gemm (cuBLAS on f16) matches a double-precision product, every CUDA type") {
    if (!device_or_skip()) return;
    cu::stream s;
    cu::gemm g(s.get());
    CHECK(g.stream() == s.get());
    uint32_t seed = 300;
    for (const weight_type t : cuda_types(tandem::kernels::op::matmul)) {
      const auto cols_list = cols_for(t);
      for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{67, cols_list[1]}, {259, cols_list.back()}, {1031, cols_list.front()}}) {
        const weights w = make_weights(t, rows, cols, ++seed);
        const auto x = gaussian(size_t(k_max_x * cols), seed + 5000);
        dev_array<uint8_t> dw(w.q, s);
        dev_array<float> dx(x, s);
        // 3 goes through matvec_q8 (its types) or matvec; 9 and 64 through the f16 scratch
        // and cuBLAS.
        for (const int64_t n_x : {3, 9, 64}) {
          CAPTURE(display_name(t));
          CAPTURE(rows);
          CAPTURE(cols);
          CAPTURE(n_x);
          const size_t need = cu::gemm::scratch_bytes(rows, cols, n_x);
          cu::device_buffer scratch(std::max<size_t>(need, 1));
          dev_array<float> dy(size_t(n_x * rows), s);
          g.run(t, dw.get(), rows, cols, dx.get(), n_x, dy.get(), scratch.get(), need);
          const auto y = dy.read();
          std::vector<double> ref, mag;
          reference_product(w, x, n_x, ref, mag);
          const bool q8 = n_x <= cu::k_matvec_max_rows && cu::matvec_q8_supports(t);
          const auto conv_q8 = q8 ? q8_conversion_bound(w, x, n_x) : std::vector<double>(y.size(), 0.0);
          double worst = 0;
          for (size_t i = 0; i < y.size(); ++i)
            worst = std::max(worst, std::fabs(y[i] - ref[i]) / (q8 ? conv_q8[i] + k_q8_accumulation * mag[i] + 1e-30
                                                                   : k_gemm_rel * mag[i] + k_gemm_abs_per_col * double(cols)));
          CHECK(worst <= 1.0);
          std::vector<float> yc(y.size());
          cpu::matmul(t, w.q.data(), rows, cols, x.data(), n_x, yc.data(), nullptr);
          const auto conv = cpu_conversion_bound(w, x, n_x, bounds_of(t));
          double worst_cpu = 0;
          for (size_t i = 0; i < y.size(); ++i)
            worst_cpu = std::max(worst_cpu, std::fabs(double(y[i]) - yc[i]) / (conv[i] + conv_q8[i] + (k_gemm_rel + k_cpu_accumulation) * mag[i] +
                                                                               k_gemm_abs_per_col * double(cols)));
          CHECK(worst_cpu <= 1.0);
        }
      }
    }
  }

  TEST_CASE("dequantize_f16 gives the CPU's dequantized values rounded to f16") {
    if (!device_or_skip()) return;
    cu::stream s;
    uint32_t seed = 500;
    for (const weight_type t : cuda_types(tandem::kernels::op::dequantize)) {
      const auto cols_list = cols_for(t);
      for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{1, cols_list.front()}, {67, cols_list[1]}, {259, cols_list.back()}}) {
        CAPTURE(display_name(t));
        CAPTURE(rows);
        CAPTURE(cols);
        const weights w = make_weights(t, rows, cols, ++seed);
        dev_array<uint8_t> dw(w.q, s);
        const size_t n = size_t(rows * cols);
        dev_array<uint16_t> out(n, s);
        cu::dequantize_f16(t, dw.get(), int64_t(n), out.get(), s.get());
        const auto got = out.read();
        // The f32 values are the CPU's (exact scale products) and f16 rounding is to nearest
        // even, so the bits agree; a quantized type may differ by one f16 step where another
        // order of its scale products lands on a rounding boundary.
        const bool exact = info(t).block_elems == 1;
        size_t off = 0, far = 0;
        for (size_t i = 0; i < n; ++i) {
          const uint16_t want = cpu::fp32_to_fp16(w.wd[i]);
          if (got[i] == want) continue;
          ++off;
          const bool same_sign = (got[i] & 0x8000) == (want & 0x8000);
          far += !same_sign || std::abs(int(got[i]) - int(want)) > 1;
        }
        if (exact) CHECK(off == 0);
        CHECK(far == 0);
        CHECK(off <= n / 1000);
      }
    }
  }

  TEST_CASE("get_rows gathers embedding rows as the CPU dequantizes them") {
    if (!device_or_skip()) return;
    cu::stream s;
    uint32_t seed = 700;
    for (const weight_type t : cuda_types(tandem::kernels::op::get_rows)) {
      for (const int64_t cols : cols_for(t)) {
        CAPTURE(display_name(t));
        CAPTURE(cols);
        const int64_t rows = 50;
        const weights w = make_weights(t, rows, cols, ++seed);
        dev_array<uint8_t> table(w.q, s);
        // Repeats, the first and the last row, out of order.
        const std::vector<int32_t> ids{3, 0, 49, 3, 17, 48, 49};
        dev_array<int32_t> dids(ids, s);
        const size_t n = ids.size();
        dev_array<float> out(n * size_t(cols), s);
        cu::get_rows(t, table.get(), cols, dids.get(), int64_t(n), out.get(), s.get());
        const auto got = out.read();
        std::vector<float> want(got.size());
        for (size_t r = 0; r < n; ++r) std::copy_n(w.wd.begin() + ids[r] * cols, cols, want.begin() + int64_t(r) * cols);
        // Exact scale products round once on both sides; 1e-6 only allows another order.
        CHECK(worst_ratio(got, want, 1e-6, 1e-30) <= 1.0);
      }
    }
  }

  TEST_CASE("a weight type the CUDA table lacks is refused, naming it") {
    if (!device_or_skip()) return;
    cu::stream s;
    // No kernel on either device, so zero bytes of the right size stand in for the weights.
    constexpr weight_type missing = weight_type::q2_k;
    REQUIRE_FALSE(tandem::kernels::supports(tandem::kernels::device_kind::cuda, tandem::kernels::op::matvec, missing));
    const int64_t rows = 4, cols = 256;
    dev_array<uint8_t> dw(std::vector<uint8_t>(size_t(rows * row_bytes(missing, cols)), 0), s);
    dev_array<float> dx(gaussian(size_t(16 * cols), 2), s);
    dev_array<float> dy(size_t(16 * rows), s);
    dev_array<int32_t> ids(std::vector<int32_t>{0, 1}, s);
    dev_array<uint16_t> half(size_t(rows * cols), s);
    CHECK_THROWS_WITH_AS(cu::matvec(missing, dw.get(), rows, cols, dx.get(), 1, dy.get(), s.get()), doctest::Contains("Q2_K"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(cu::dequantize_f16(missing, dw.get(), rows * cols, half.get(), s.get()), doctest::Contains("Q2_K"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(cu::get_rows(missing, dw.get(), cols, ids.get(), 2, dy.get(), s.get()), doctest::Contains("Q2_K"), std::invalid_argument);
    cu::gemm g(s.get());
    const size_t need = cu::gemm::scratch_bytes(rows, cols, 16);
    cu::device_buffer scratch(std::max<size_t>(need, 1));
    CHECK_THROWS_WITH_AS(g.run(missing, dw.get(), rows, cols, dx.get(), 16, dy.get(), scratch.get(), need), doctest::Contains("Q2_K"),
                         std::invalid_argument);
    // Refused before anything was queued: the outputs are untouched and the stream is fine.
    CHECK_NOTHROW(s.synchronize());
    const auto y = dy.read(false);
    CHECK(std::all_of(y.begin(), y.end(), [](float v) { return all_ff(v); }));
  }
}

#else  // !TANDEM_HAVE_CUDA

TEST_SUITE("gpu_matmul") {
  TEST_CASE("CUDA ops") {
    MESSAGE("skipped: built without CUDA");
    if (std::getenv("TANDEM_GPU_ENTRY")) std::exit(77);
  }
}

#endif
