// The CUDA ops (kernels/cuda/ops.h) against their CPU twins and double-precision references,
// on seeded random data over shapes that reach each kernel's edges: row counts that are not
// multiples of a warp or of a block of rows, columns that are not a multiple of 32 where the
// type allows it, several K-quant super-blocks, and a paged KV cache with scrambled block
// tables. Every output starts as 0xFF bytes (NaN) followed by a guard tail of the same, so an
// element a kernel forgets to write, or one it writes past the end, shows.
// Suite "gpu_ops" runs as CTest's kernels_gpu entry, which reports "skipped" (exit 77) where
// no device answers or the build has no CUDA; run any other way it passes with a message.
#include <doctest/doctest.h>

#include <cstdlib>

#if defined(TANDEM_HAVE_CUDA)

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <iterator>
#include <limits>
#include <random>
#include <stdexcept>
#include <string>
#include <type_traits>
#include <vector>

#include "kernels/cpu/act_quant.h"
#include "kernels/cpu/matmul.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/quants.h"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"
#include "kernels/op_table.h"
#include "kernels/weight_type.h"
#include "tests/kernels/kernel_test_util.h"

namespace {

namespace cu = tandem::kernels::cuda;
namespace cpu = tandem::kernels::cpu;
using tandem::kernels::display_name;
using tandem::kernels::info;
using tandem::kernels::row_bytes;
using tandem::kernels::weight_type;
using tandem::test::gaussian;

// Whether a device answers; if not, says why. Under CTest's kernels_gpu entry
// (TANDEM_GPU_ENTRY set) the process exits 77 instead, which CTest reports as skipped.
bool device_or_skip() {
  std::string why;
  if (cu::device_available(&why)) return true;
  if (std::getenv("TANDEM_GPU_ENTRY")) {
    std::cerr << "SKIPPED: " << why << "\n";
    std::exit(77);
  }
  MESSAGE("skipped: " << why);
  return false;
}

// The weight types the CUDA table lists for `o`: a type added there is tested here.
std::vector<weight_type> cuda_types(tandem::kernels::op o) {
  size_t n = 0;
  const auto* t = tandem::kernels::op_table(&n);
  for (size_t i = 0; i < n; ++i)
    if (t[i].device == tandem::kernels::device_kind::cuda && t[i].o == o)
      return std::vector<weight_type>(t[i].types, t[i].types + t[i].n_types);
  return {};
}

template <class T>
bool all_ff(const T& v) {
  unsigned char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  return std::all_of(b, b + sizeof(T), [](unsigned char c) { return c == 0xFF; });
}

// Elements after the end of every device array, left as 0xFF bytes and checked afterwards.
constexpr size_t k_guard = 64;

// n elements of T on the device plus a guard tail, all 0xFF bytes (NaN for floats, -1 for
// int32) unless filled from the host.
template <class T>
class dev_array {
 public:
  dev_array(size_t n, const cu::stream& s) : n_(n), buf_((n + k_guard) * sizeof(T)), s_(s) {
    cu::fill_bytes(buf_.get(), 0xFF, buf_.size(), s_.get());
  }
  // Synchronises after the copy, so the host vector may go at once.
  dev_array(const std::vector<T>& v, const cu::stream& s) : dev_array(v.size(), s) {
    if (!v.empty()) cu::copy_to_device(buf_.get(), v.data(), v.size() * sizeof(T), s_.get());
    s_.synchronize();
  }
  T* get() const { return buf_.as<T>(); }
  size_t size() const { return n_; }

  // The n elements once the stream's work is done. Checks that the guard is intact (nothing
  // written past the end) and, with all_written, that every element was written (none kept
  // the poison) and that no float is NaN.
  std::vector<T> read(bool all_written = true) const {
    std::vector<T> all(n_ + k_guard);
    cu::copy_to_host(all.data(), buf_.get(), all.size() * sizeof(T), s_.get());
    s_.synchronize();
    size_t past_end = 0;
    for (size_t i = n_; i < all.size(); ++i) past_end += !all_ff(all[i]);
    CHECK_MESSAGE(past_end == 0, "elements written past the end");
    all.resize(n_);
    if (all_written) {
      size_t untouched = 0, nans = 0;
      for (const T& v : all) {
        untouched += all_ff(v);
        if constexpr (std::is_floating_point_v<T>) nans += std::isnan(v);
      }
      CHECK_MESSAGE(untouched == 0, "elements left unwritten");
      CHECK(nans == 0);
    }
    return all;
  }

 private:
  size_t n_;
  cu::device_buffer buf_;
  const cu::stream& s_;
};

// Largest |a - b| / (rel * |b| + abs) over the elements: <= 1 passes.
double worst_ratio(const std::vector<float>& a, const std::vector<float>& b, double rel, double abs) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i)
    worst = std::max(worst, std::fabs(double(a[i]) - double(b[i])) / (rel * std::fabs(double(b[i])) + abs));
  return worst;
}

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
// the f16 rounding of the block scale). Comparing with the CPU at that bound, plus both
// accumulations, checks the CPU twin agrees without a threshold tuned to these data.
struct product_bounds {
  weight_type t;
  double matvec_exact;
  double x_rel;
  bool x_per_block;
};
constexpr product_bounds k_product_bounds[] = {
    {weight_type::f32, 1e-5, 0.0, false},     {weight_type::f16, 1e-5, 4.9e-4, false},
    {weight_type::bf16, 1e-5, 3.91e-3, false}, {weight_type::q8_0, 1e-5, 4.5e-3, true},
    {weight_type::q4_0, 1e-5, 4.5e-3, true},  {weight_type::q4_k, 1e-5, 4e-3, true},
    {weight_type::q5_k, 1e-5, 4e-3, true},    {weight_type::q6_k, 1e-5, 4e-3, true},
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
void reference_product(const weights& w, const std::vector<float>& x, int64_t n_x, std::vector<double>& ref,
                       std::vector<double>& mag) {
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
std::vector<double> cpu_conversion_bound(const weights& w, const std::vector<float>& x, int64_t n_x,
                                         const product_bounds& b) {
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
      out[size_t(r * w.rows + o)] = s;
    }
  return out;
}

// ---- paged KV and attention ------------------------------------------------------------

// Absolute bounds (outputs are softmax-weighted averages of N(0, 1) values: of order 1).
// A key wrongly masked, or read from the wrong block, moves outputs by ~1e-2 or more.
struct attention_bounds {
  cpu::kv_type kt;
  double vs_exact;
  double vs_cpu;
};
constexpr attention_bounds k_attention_bounds[] = {
    // f32 cache: f32 arithmetic on both sides, float noise ~1e-6.
    {cpu::kv_type::f32, 1e-4, 1e-4},
    // f16 cache: the reference reads the cache's own values, so only the arithmetic differs;
    // 3e-3 leaves room for Q and the softmax weights rounded to f16 on their way into
    // half-precision tensor cores (2^-11 relative each), not for an f16 accumulator. The
    // CPU twin does keep llama.cpp's f16 accumulator (within 1e-2 of exact, attention_test),
    // hence the looser bound against it.
    {cpu::kv_type::f16, 3e-3, 1.3e-2},
};

struct attn_shape {
  int n_heads, n_kv_heads, head_dim;
  int64_t block_tokens;
};
// GQA ratios 4, 1, 8, 8 and 3; head_dim 64 and 128; blocks of 16 and 32 positions.
constexpr attn_shape k_attn_shapes[] = {
    {8, 2, 64, 16}, {4, 4, 64, 32}, {16, 2, 128, 16}, {8, 1, 128, 32}, {12, 4, 64, 16},
};

// Sequences of one batch: `prefix` positions already in the cache, then `n_new` rows in the
// mixed batch (prefill from scratch, decode, a chunk from a block boundary, a first token, a
// long decode, a chunk from mid-block, a prefill that fills whole blocks), then one decode row
// each in a decode-only batch.
struct seq_plan {
  int64_t prefix, n_new;
};
constexpr seq_plan k_seqs[] = {{0, 21}, {40, 1}, {16, 9}, {0, 1}, {130, 1}, {7, 3}, {0, 32}};
constexpr int k_n_seqs = int(std::size(k_seqs));

struct kv_row {
  int seq;
  int64_t pos;
};

// Fisher-Yates over mt19937 (std::shuffle's algorithm is the library's choice), so the block
// tables are the same everywhere.
std::vector<int32_t> permutation(int32_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> p(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) p[size_t(i)] = i;
  for (int32_t i = n - 1; i > 0; --i) std::swap(p[size_t(i)], p[size_t(rng() % uint32_t(i + 1))]);
  return p;
}

}  // namespace

TEST_SUITE("gpu_ops") {
  TEST_CASE("matvec matches a double-precision product and the CPU matmul, every CUDA type") {
    if (!device_or_skip()) return;
    cu::stream s;
    uint32_t seed = 100;
    for (const weight_type t : cuda_types(tandem::kernels::op::matvec)) {
      const auto& b = bounds_of(t);
      double margin_exact = 0, margin_cpu = 0;  // the largest fractions of the bounds used, for the log
      const auto cols_list = cols_for(t);
      std::vector<std::pair<int64_t, int64_t>> shapes;  // (rows, cols)
      for (const int64_t c : cols_list)
        for (const int64_t r : {1, 7, 67}) shapes.push_back({r, c});
      shapes.push_back({1031, cols_list[1]});  // many row blocks, a ragged last one
      shapes.push_back({259, cols_list.back()});
      for (const auto& [rows, cols] : shapes) {
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
            worst_cpu = std::max(worst_cpu, std::fabs(double(y[i]) - yc[i]) /
                                                (conv[i] + (b.matvec_exact + k_cpu_accumulation) * mag[i] + 1e-30));
          CHECK(worst_cpu <= 1.0);
          margin_cpu = std::max(margin_cpu, worst_cpu);
        }
      }
      MESSAGE("matvec " << display_name(t) << ": " << margin_exact << " of the exact bound, " << margin_cpu
                        << " of the CPU bound");
    }
  }

  TEST_CASE("gemm (cuBLAS on f16) matches a double-precision product, every CUDA type") {
    if (!device_or_skip()) return;
    cu::stream s;
    cu::gemm g(s.get());
    CHECK(g.stream() == s.get());
    uint32_t seed = 300;
    for (const weight_type t : cuda_types(tandem::kernels::op::matmul)) {
      const auto cols_list = cols_for(t);
      for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{67, cols_list[1]}, {259, cols_list.back()},
                                       {1031, cols_list.front()}}) {
        const weights w = make_weights(t, rows, cols, ++seed);
        const auto x = gaussian(size_t(k_max_x * cols), seed + 5000);
        dev_array<uint8_t> dw(w.q, s);
        dev_array<float> dx(x, s);
        // 3 goes through matvec; 9 and 64 through the f16 scratch and cuBLAS.
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
          double worst = 0;
          for (size_t i = 0; i < y.size(); ++i)
            worst = std::max(worst, std::fabs(y[i] - ref[i]) / (k_gemm_rel * mag[i] + k_gemm_abs_per_col * double(cols)));
          CHECK(worst <= 1.0);
          std::vector<float> yc(y.size());
          cpu::matmul(t, w.q.data(), rows, cols, x.data(), n_x, yc.data(), nullptr);
          const auto conv = cpu_conversion_bound(w, x, n_x, bounds_of(t));
          double worst_cpu = 0;
          for (size_t i = 0; i < y.size(); ++i)
            worst_cpu = std::max(worst_cpu, std::fabs(double(y[i]) - yc[i]) /
                                                (conv[i] + (k_gemm_rel + k_cpu_accumulation) * mag[i] +
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
      for (const auto& [rows, cols] : {std::pair<int64_t, int64_t>{1, cols_list.front()}, {67, cols_list[1]},
                                       {259, cols_list.back()}}) {
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
        for (size_t r = 0; r < n; ++r)
          std::copy_n(w.wd.begin() + ids[r] * cols, cols, want.begin() + int64_t(r) * cols);
        // Exact scale products round once on both sides; 1e-6 only allows another order.
        CHECK(worst_ratio(got, want, 1e-6, 1e-30) <= 1.0);
      }
    }
  }

  TEST_CASE("rms_norm matches the CPU per row, in place and not, with and without weights") {
    if (!device_or_skip()) return;
    cu::stream s;
    uint32_t seed = 900;
    // (n_rows, n): one element, odd widths, per-head q/k norms (48 heads of 64), model widths.
    for (const auto& [n_rows, n] : {std::pair<int64_t, int64_t>{1, 1}, {3, 7}, {48, 64}, {5, 576}, {2, 4096}, {3, 5003}})
      for (const bool weighted : {false, true})
        for (const bool in_place : {false, true}) {
          CAPTURE(n_rows);
          CAPTURE(n);
          CAPTURE(weighted);
          CAPTURE(in_place);
          auto x = gaussian(size_t(n_rows * n), ++seed, 2.0f, 0.3f);
          if (n_rows > 2) std::fill(x.begin() + n, x.begin() + 2 * n, 0.0f);  // an all-zero row: 0, not NaN
          const auto wv = gaussian(size_t(n), seed + 1, 0.5f, 1.0f);
          const float eps = 1e-5f;
          dev_array<float> dx(x, s);
          dev_array<float> dw(wv, s);
          dev_array<float> dout(in_place ? 1 : x.size(), s);
          float* out = in_place ? dx.get() : dout.get();
          cu::rms_norm(dx.get(), weighted ? dw.get() : nullptr, out, n_rows, n, eps, s.get());
          const auto got = in_place ? dx.read() : dout.read();
          std::vector<float> want(x.size());
          for (int64_t r = 0; r < n_rows; ++r)
            cpu::rms_norm(x.data() + r * n, weighted ? wv.data() : nullptr, want.data() + r * n, n, eps);
          // The CPU sums squares in double; a float tree sum and rsqrtf stay within ~1e-6.
          CHECK(worst_ratio(got, want, 1e-5, 1e-7) <= 1.0);
        }
  }

  TEST_CASE("rope matches the CPU: adjacent and neox, partial rotation, freq_factors, yarn") {
    if (!device_or_skip()) return;
    cu::stream s;
    // Positions out of order, up to 4000 (the CPU's angle error grows with the position).
    const std::vector<int32_t> pos{0, 1, 17, 300, 4000, 5};
    const int64_t n_rows = int64_t(pos.size());
    dev_array<int32_t> dpos(pos, s);
    struct rope_case {
      const char* what;
      int n_heads, head_dim, n_rot;
      float freq_base, freq_scale;
      bool factors;
      float ext_factor, attn_factor;
    };
    const rope_case cases[] = {
        {"full rotation", 4, 64, 64, 10000.0f, 1.0f, false, 0.0f, 1.0f},
        {"n_rot 0 rotates the whole head", 3, 64, 0, 10000.0f, 1.0f, false, 0.0f, 1.0f},
        {"partial rotation, base 1e6", 2, 80, 32, 1e6f, 1.0f, false, 0.0f, 1.0f},
        {"linear scaling", 2, 64, 64, 10000.0f, 0.25f, false, 0.0f, 1.0f},
        {"llama3 freq_factors, n_rot < head_dim", 8, 128, 64, 500000.0f, 1.0f, true, 0.0f, 1.0f},
        {"yarn", 2, 64, 64, 10000.0f, 0.25f, false, 1.0f, 1.0f},
        {"yarn, half ramp, attn_factor", 4, 128, 96, 10000.0f, 0.25f, true, 0.5f, 0.9f},
    };
    uint32_t seed = 1100;
    for (const auto& c : cases)
      for (const auto pairing : {cpu::rope_pairing::adjacent, cpu::rope_pairing::neox}) {
        CAPTURE(c.what);
        CAPTURE(int(pairing));
        const int n_rot = c.n_rot > 0 ? c.n_rot : c.head_dim;
        std::vector<float> ff(size_t(n_rot / 2));
        for (size_t i = 0; i < ff.size(); ++i) ff[i] = 1.0f + 7.0f * float(i) / float(ff.size() - 1);  // 1 .. 8 as llama3
        cpu::rope_params p;
        p.n_rot = c.n_rot;
        p.freq_base = c.freq_base;
        p.freq_scale = c.freq_scale;
        p.pairing = pairing;
        p.ext_factor = c.ext_factor;
        p.attn_factor = c.attn_factor;
        p.n_ctx_orig = 4096;  // yarn correction dims 10 .. 23: a real ramp
        // The CUDA op takes the factors as an argument and ignores p.freq_factors: leave it
        // null there, so a kernel reading it would lose the factors and fail the comparison.
        cpu::rope_params p_host = p;
        p_host.freq_factors = c.factors ? ff.data() : nullptr;
        // Rows as in a fused QKV buffer: the heads rotated here, then other values that must
        // stay untouched.
        const int64_t used = int64_t(c.n_heads) * c.head_dim;
        const int64_t row_stride = used + 2 * c.head_dim + 3;
        const auto x = gaussian(size_t(n_rows * row_stride), ++seed);
        dev_array<float> dx(x, s);
        dev_array<float> dff(ff, s);
        cu::rope(dx.get(), n_rows, row_stride, c.n_heads, c.head_dim, dpos.get(), p, c.factors ? dff.get() : nullptr,
                 s.get());
        const auto got = dx.read();
        auto want = x;
        for (int64_t r = 0; r < n_rows; ++r) cpu::rope(want.data() + r * row_stride, c.n_heads, c.head_dim, pos[size_t(r)], p_host);
        for (int64_t r = 0; r < n_rows; ++r) {
          CAPTURE(pos[size_t(r)]);
          // Both sides compute angles in float: each within 1e-5 + 1e-6 * pos of exact
          // (rope_test), so within twice that of each other.
          const double tol = 2e-5 + 2e-6 * pos[size_t(r)];
          double worst = 0;
          size_t others_changed = 0;
          for (int64_t i = 0; i < row_stride; ++i) {
            const size_t k = size_t(r * row_stride + i);
            if (i < used) worst = std::max(worst, std::fabs(double(got[k]) - want[k]));
            else others_changed += got[k] != x[k];
          }
          CHECK(worst <= tol);
          CHECK(others_changed == 0);
        }
      }
  }

  TEST_CASE("swiglu, add and add_rows match the CPU") {
    if (!device_or_skip()) return;
    cu::stream s;
    uint32_t seed = 1300;
    for (const int64_t n : {1, 33, 12291}) {
      CAPTURE(n);
      auto gate = gaussian(size_t(n), ++seed, 4.0f);
      // Saturation: e^-g overflows for very negative g (the result is -0, not NaN).
      const float extremes[] = {-100.0f, -20.0f, 0.0f, 20.0f, 100.0f};
      for (size_t i = 0; i < std::size(extremes) && i < size_t(n); ++i) gate[size_t(n) - 1 - i] = extremes[i];
      const auto up = gaussian(size_t(n), seed + 1);
      dev_array<float> dg(gate, s), du(up, s);
      cu::swiglu(dg.get(), du.get(), n, s.get());
      const auto got = dg.read();
      auto want = gate;
      cpu::swiglu(want.data(), up.data(), n);
      // expf against the device's exponential (a few ulp, more for large |g| with __expf).
      CHECK(worst_ratio(got, want, 1e-5, 1e-30) <= 1.0);

      const auto y = gaussian(size_t(n), seed + 2);
      dev_array<float> dx(up, s), dy(y, s);
      cu::add(dx.get(), dy.get(), n, s.get());
      const auto sum = dx.read();
      size_t differ = 0;
      for (int64_t i = 0; i < n; ++i) differ += sum[size_t(i)] != up[size_t(i)] + y[size_t(i)];
      CHECK(differ == 0);  // one IEEE addition each: bit for bit
    }
    for (const auto& [n_rows, n] : {std::pair<int64_t, int64_t>{1, 1}, {5, 77}, {64, 4096}, {3, 5003}}) {
      CAPTURE(n_rows);
      CAPTURE(n);
      const auto x = gaussian(size_t(n_rows * n), ++seed);
      const auto bias = gaussian(size_t(n), seed + 1);
      dev_array<float> dx(x, s), db(bias, s);
      cu::add_rows(dx.get(), db.get(), n_rows, n, s.get());
      const auto got = dx.read();
      size_t differ = 0;
      for (int64_t r = 0; r < n_rows; ++r)
        for (int64_t i = 0; i < n; ++i) differ += got[size_t(r * n + i)] != x[size_t(r * n + i)] + bias[size_t(i)];
      CHECK(differ == 0);
    }
  }

  TEST_CASE("softmax matches the CPU per row, with -inf entries and peaked rows") {
    if (!device_or_skip()) return;
    cu::stream s;
    uint32_t seed = 1500;
    for (const int64_t n : {1, 5, 1000, 49155}) {
      CAPTURE(n);
      const int64_t n_rows = 3;
      auto x = gaussian(size_t(n_rows * n), ++seed, 3.0f);
      const float inf = std::numeric_limits<float>::infinity();
      // Row 1: every third entry masked (keeping entry 0); row 2: one logit far above the rest.
      for (int64_t i = 1; i < n; i += 3) x[size_t(n + i)] = -inf;
      x[size_t(2 * n + n / 2)] = 80.0f;
      dev_array<float> dx(x, s);
      cu::softmax(dx.get(), n_rows, n, s.get());
      const auto got = dx.read();
      auto want = x;
      for (int64_t r = 0; r < n_rows; ++r) cpu::softmax(want.data() + r * n, n);
      // Exponentials within a few ulp (~4e-6 relative with __expf at -30) and a float sum of
      // up to 49155 terms; 1e-30 absolute covers outputs flushed to zero.
      CHECK(worst_ratio(got, want, 2e-5, 1e-30) <= 1.0);
      for (int64_t i = 1; i < n; i += 3) CHECK(got[size_t(n + i)] == 0.0f);
    }
  }

  TEST_CASE("kv_store and attention over a paged cache match the CPU and a double-precision reference") {
    if (!device_or_skip()) return;
    cu::stream s;
    uint32_t seed = 1700;
    for (const auto& sh : k_attn_shapes)
      for (const auto& bounds : k_attention_bounds) {
        const cpu::kv_type kt = bounds.kt;
        CAPTURE(sh.n_heads);
        CAPTURE(sh.n_kv_heads);
        CAPTURE(sh.head_dim);
        CAPTURE(sh.block_tokens);
        CAPTURE(kt == cpu::kv_type::f16 ? "f16" : "f32");
        const int64_t row = int64_t(sh.n_kv_heads) * sh.head_dim;
        const int64_t bt = sh.block_tokens;
        const int64_t stride = (bt + 3) * row;  // a gap between blocks
        const size_t elem = kt == cpu::kv_type::f32 ? 4 : 2;
        const int64_t q_row = int64_t(sh.n_heads) * sh.head_dim;
        const float scale = 1.0f / std::sqrt(float(sh.head_dim));

        // Block tables: each sequence's blocks drawn from a scrambled pool with spares.
        std::vector<int64_t> len(k_n_seqs), table_at(k_n_seqs);
        int64_t n_blocks = 0;
        for (int q = 0; q < k_n_seqs; ++q) {
          len[size_t(q)] = k_seqs[q].prefix + k_seqs[q].n_new + 1;
          n_blocks += (len[size_t(q)] + bt - 1) / bt;
        }
        const int32_t n_pool = int32_t(n_blocks + 5);
        const auto perm = permutation(n_pool, ++seed);
        std::vector<int32_t> tables;
        for (int q = 0; q < k_n_seqs; ++q) {
          table_at[size_t(q)] = int64_t(tables.size());
          for (int64_t b = 0; b < (len[size_t(q)] + bt - 1) / bt; ++b) tables.push_back(perm[tables.size()]);
        }
        dev_array<int32_t> dtables(tables, s);
        const auto slot = [&](int q, int64_t p) {  // element offset of position p of sequence q
          return int64_t(tables[size_t(table_at[size_t(q)] + p / bt)]) * stride + (p % bt) * row;
        };

        // Every sequence's K and V rows for all its positions.
        std::vector<std::vector<float>> kdata, vdata;
        for (int q = 0; q < k_n_seqs; ++q) {
          kdata.push_back(gaussian(size_t(len[size_t(q)] * row), ++seed));
          vdata.push_back(gaussian(size_t(len[size_t(q)] * row), ++seed));
        }

        // The pools start as NaN bytes, as do the host copies the CPU writes into.
        const size_t pool_bytes = size_t(n_pool * stride) * elem;
        dev_array<uint8_t> kpool(pool_bytes, s), vpool(pool_bytes, s);
        std::vector<uint8_t> hk(pool_bytes, 0xFF), hv(pool_bytes, 0xFF);
        const cu::paged_layer layer{kpool.get(), vpool.get(), kt, bt, stride, row};

        // Device arrays of a batch's row map.
        struct batch {
          dev_array<int32_t> pos, table_of_row;
          cu::row_map map() const { return {pos.get(), nullptr, table_of_row.get()}; }
        };
        const auto make_batch = [&](const std::vector<kv_row>& rows) {
          std::vector<int32_t> pos, tor;
          for (const auto& r : rows) {
            pos.push_back(int32_t(r.pos));
            tor.push_back(int32_t(table_at[size_t(r.seq)]));
          }
          return batch{dev_array<int32_t>(pos, s), dev_array<int32_t>(tor, s)};
        };

        // Stores the rows' K and V on both sides, then compares the whole pools byte for byte:
        // every row where the block table puts it, rounded to nearest even, nothing else touched.
        const auto store = [&](const std::vector<kv_row>& rows) {
          std::vector<float> kr, vr;
          for (const auto& r : rows) {
            kr.insert(kr.end(), kdata[size_t(r.seq)].begin() + r.pos * row, kdata[size_t(r.seq)].begin() + (r.pos + 1) * row);
            vr.insert(vr.end(), vdata[size_t(r.seq)].begin() + r.pos * row, vdata[size_t(r.seq)].begin() + (r.pos + 1) * row);
            const size_t at = size_t(slot(r.seq, r.pos)) * elem;
            cpu::kv_store(hk.data() + at, kt, 0, kdata[size_t(r.seq)].data() + r.pos * row, 1, row);
            cpu::kv_store(hv.data() + at, kt, 0, vdata[size_t(r.seq)].data() + r.pos * row, 1, row);
          }
          const batch b = make_batch(rows);
          cu::row_map m = b.map();
          m.tables = dtables.get();
          dev_array<float> dk(kr, s), dv(vr, s);
          cu::kv_store(layer, dk.get(), dv.get(), int64_t(rows.size()), m, s.get());
          const auto gk = kpool.read(false), gv = vpool.read(false);
          size_t k_wrong = 0, v_wrong = 0;
          for (size_t i = 0; i < pool_bytes; i += elem) {
            k_wrong += std::memcmp(gk.data() + i, hk.data() + i, elem) != 0;
            v_wrong += std::memcmp(gv.data() + i, hv.data() + i, elem) != 0;
          }
          CHECK(k_wrong == 0);
          CHECK(v_wrong == 0);
        };

        const auto cache_value = [&](const std::vector<uint8_t>& pool, int64_t at) {
          if (kt == cpu::kv_type::f32) {
            float f;
            std::memcpy(&f, pool.data() + size_t(at) * 4, 4);
            return double(f);
          }
          uint16_t h;
          std::memcpy(&h, pool.data() + size_t(at) * 2, 2);
          return double(cpu::fp16_to_fp32(h));
        };

        // Runs attention for the rows (queries q, in the rows' order) and checks it against
        // exact attention over the host cache and against the CPU twin (out_cpu, same order).
        const auto attend = [&](const std::vector<kv_row>& rows, const std::vector<float>& q,
                                const std::vector<float>& out_cpu) {
          const batch b = make_batch(rows);
          cu::row_map m = b.map();
          m.tables = dtables.get();
          dev_array<float> dq(q, s);
          dev_array<float> dout(q.size(), s);
          cu::attention(dq.get(), dout.get(), int64_t(rows.size()), m, layer, sh.n_heads, sh.n_kv_heads, sh.head_dim,
                        scale, s.get());
          const auto got = dout.read();
          const int group = sh.n_heads / sh.n_kv_heads;
          double worst_exact = 0, worst_cpu = 0;
          for (size_t r = 0; r < rows.size(); ++r)
            for (int h = 0; h < sh.n_heads; ++h) {
              const float* qh = q.data() + int64_t(r) * q_row + h * sh.head_dim;
              const int64_t kv_off = int64_t(h / group) * sh.head_dim;
              const int64_t n_keys = rows[r].pos + 1;
              std::vector<double> sc(static_cast<size_t>(n_keys));
              double mx = -1e300;
              for (int64_t t = 0; t < n_keys; ++t) {
                double dot = 0;
                const int64_t at = slot(rows[r].seq, t) + kv_off;
                for (int d = 0; d < sh.head_dim; ++d) dot += double(qh[d]) * cache_value(hk, at + d);
                sc[size_t(t)] = dot * scale;
                mx = std::max(mx, sc[size_t(t)]);
              }
              double sum = 0;
              for (auto& v : sc) sum += v = std::exp(v - mx);
              for (int d = 0; d < sh.head_dim; ++d) {
                double o = 0;
                for (int64_t t = 0; t < n_keys; ++t) o += sc[size_t(t)] * cache_value(hv, slot(rows[r].seq, t) + kv_off + d);
                const size_t k = size_t(int64_t(r) * q_row + h * sh.head_dim + d);
                worst_exact = std::max(worst_exact, std::fabs(got[k] - o / sum));
                worst_cpu = std::max(worst_cpu, std::fabs(double(got[k]) - out_cpu[k]));
              }
            }
          CHECK(worst_exact <= bounds.vs_exact);
          CHECK(worst_cpu <= bounds.vs_cpu);
        };

        // The CPU twin over the same host cache: one run per sequence of consecutive rows.
        const auto cpu_attention = [&](const std::vector<kv_row>& rows, const std::vector<float>& q) {
          std::vector<float> out(q.size(), -1.0f);
          std::vector<cpu::attention_run> runs;
          for (size_t r = 0; r < rows.size();) {
            size_t e = r + 1;
            while (e < rows.size() && rows[e].seq == rows[r].seq) ++e;
            cpu::attention_run run{q.data() + int64_t(r) * q_row, int64_t(e - r), rows[r].pos, hk.data(), hv.data(),
                                   out.data() + int64_t(r) * q_row};
            run.pages = {tables.data() + table_at[size_t(rows[r].seq)], bt, stride};
            runs.push_back(run);
            r = e;
          }
          cpu::attention_many(runs.data(), int64_t(runs.size()), kt, sh.n_heads, sh.n_kv_heads, sh.head_dim, scale,
                              nullptr);
          return out;
        };

        // 1. The earlier context of every sequence, in one kv_store.
        std::vector<kv_row> prefix_rows, mixed, decode;
        for (int q = 0; q < k_n_seqs; ++q)
          for (int64_t p = 0; p < k_seqs[q].prefix; ++p) prefix_rows.push_back({q, p});
        store(prefix_rows);

        // 2. A mixed batch (prefill chunks and decode rows, sequences in a scrambled order),
        //    stored and attended; then the same rows in a fully scrambled order.
        for (const int q : {4, 0, 1, 5, 3, 6, 2})
          for (int64_t j = 0; j < k_seqs[q].n_new; ++j) mixed.push_back({q, k_seqs[q].prefix + j});
        store(mixed);
        const auto q_mixed = gaussian(mixed.size() * size_t(q_row), ++seed);
        {
          const auto want = cpu_attention(mixed, q_mixed);
          attend(mixed, q_mixed, want);
          const auto order = permutation(int32_t(mixed.size()), ++seed);
          std::vector<kv_row> shuffled;
          std::vector<float> q_shuffled, want_shuffled;
          for (const int32_t i : order) {
            shuffled.push_back(mixed[size_t(i)]);
            q_shuffled.insert(q_shuffled.end(), q_mixed.begin() + i * q_row, q_mixed.begin() + (i + 1) * q_row);
            want_shuffled.insert(want_shuffled.end(), want.begin() + i * q_row, want.begin() + (i + 1) * q_row);
          }
          attend(shuffled, q_shuffled, want_shuffled);
        }

        // 3. A decode-only batch: one more row for every sequence (some start a new block).
        for (int q = 0; q < k_n_seqs; ++q) decode.push_back({q, k_seqs[q].prefix + k_seqs[q].n_new});
        store(decode);
        const auto q_decode = gaussian(decode.size() * size_t(q_row), ++seed);
        attend(decode, q_decode, cpu_attention(decode, q_decode));
      }
  }

  TEST_CASE("argmax takes the first of tied maxima; top_k orders ties by index") {
    if (!device_or_skip()) return;
    cu::stream s;
    uint32_t seed = 1900;
    const float inf = std::numeric_limits<float>::infinity();
    // Values on a grid of 0.25, so ties are everywhere, including at the top.
    const auto tied = [](std::vector<float> v) {
      for (auto& x : v) x = std::floor(x * 4.0f) / 4.0f;
      return v;
    };
    for (const int64_t n : {1, 7, 1000, 49155, 151936}) {
      CAPTURE(n);
      const int64_t n_rows = 5;
      std::vector<float> x = tied(gaussian(size_t(n_rows * n), ++seed));
      float* r1 = x.data() + n;  // the maximum twice, far apart
      r1[n / 3] = 50.0f;
      r1[n - 1] = 50.0f;
      std::fill(x.begin() + 2 * n, x.begin() + 3 * n, 1.5f);        // all equal: 0
      std::fill(x.begin() + 3 * n, x.begin() + 4 * n, -inf);        // masked but the last
      x[size_t(4 * n - 1)] = -1e30f;
      std::fill(x.begin() + 4 * n, x.begin() + 5 * n, -inf);        // all masked: 0
      dev_array<float> dx(x, s);
      dev_array<int32_t> out(size_t(n_rows), s);
      cu::argmax(dx.get(), n_rows, n, out.get(), s.get());
      const auto got = out.read();
      for (int64_t r = 0; r < n_rows; ++r) {
        CAPTURE(r);
        const float* row = x.data() + r * n;
        CHECK(got[size_t(r)] == int32_t(std::max_element(row, row + n) - row));  // first of the largest
      }
    }
    for (const int64_t n : {10, 1000, 49155, 151936})
      for (const int k : {1, 7, 10, 40, cu::k_top_k_max}) {
        if (k > n) continue;
        CAPTURE(n);
        CAPTURE(k);
        std::vector<float> x = tied(gaussian(size_t(n), ++seed));
        for (int64_t i = 5; i < n; i += 7) x[size_t(i)] = -inf;
        dev_array<float> dx(x, s);
        dev_array<float> vals(size_t(k), s);
        dev_array<int32_t> ids(size_t(k), s);
        cu::top_k(dx.get(), n, k, vals.get(), ids.get(), s.get());
        const auto got_v = vals.read();
        const auto got_i = ids.read();
        std::vector<int32_t> order(static_cast<size_t>(n));
        for (int32_t i = 0; i < int32_t(n); ++i) order[size_t(i)] = i;
        std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return x[size_t(a)] > x[size_t(b)]; });
        order.resize(size_t(k));
        std::vector<float> want_v;
        for (const int32_t i : order) want_v.push_back(x[size_t(i)]);
        CHECK(got_i == order);
        CHECK(got_v == want_v);
      }
  }

  TEST_CASE("a weight type the CUDA table lacks is refused, naming it") {
    if (!device_or_skip()) return;
    cu::stream s;
    REQUIRE_FALSE(tandem::kernels::supports(tandem::kernels::device_kind::cuda, tandem::kernels::op::matvec, weight_type::q4_1));
    const int64_t rows = 4, cols = 64;
    const auto w = tandem::test::quantize_matrix(weight_type::q4_1, gaussian(size_t(rows * cols), 1), rows, cols);
    dev_array<uint8_t> dw(w, s);
    dev_array<float> dx(gaussian(size_t(16 * cols), 2), s);
    dev_array<float> dy(size_t(16 * rows), s);
    dev_array<int32_t> ids(std::vector<int32_t>{0, 1}, s);
    dev_array<uint16_t> half(size_t(rows * cols), s);
    CHECK_THROWS_WITH_AS(cu::matvec(weight_type::q4_1, dw.get(), rows, cols, dx.get(), 1, dy.get(), s.get()),
                         doctest::Contains("Q4_1"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(cu::dequantize_f16(weight_type::q4_1, dw.get(), rows * cols, half.get(), s.get()),
                         doctest::Contains("Q4_1"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(cu::get_rows(weight_type::q4_1, dw.get(), cols, ids.get(), 2, dy.get(), s.get()),
                         doctest::Contains("Q4_1"), std::invalid_argument);
    cu::gemm g(s.get());
    const size_t need = cu::gemm::scratch_bytes(rows, cols, 16);
    cu::device_buffer scratch(std::max<size_t>(need, 1));
    CHECK_THROWS_WITH_AS(g.run(weight_type::q4_1, dw.get(), rows, cols, dx.get(), 16, dy.get(), scratch.get(), need),
                         doctest::Contains("Q4_1"), std::invalid_argument);
    // Refused before anything was queued: the outputs are untouched and the stream is fine.
    CHECK_NOTHROW(s.synchronize());
    const auto y = dy.read(false);
    CHECK(std::all_of(y.begin(), y.end(), [](float v) { return all_ff(v); }));
  }
}

#else  // !TANDEM_HAVE_CUDA

TEST_SUITE("gpu_ops") {
  TEST_CASE("CUDA ops") {
    MESSAGE("skipped: built without CUDA");
    if (std::getenv("TANDEM_GPU_ENTRY")) std::exit(77);
  }
}

#endif
