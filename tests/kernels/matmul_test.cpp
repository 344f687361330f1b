#include "kernels/cpu/matmul.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <cstdlib>
#include <new>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cpu/act_quant.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/panel.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/cpu/vec_dot.h"
#include "tests/kernels/kernel_test_util.h"

// Counts heap allocations while g_counting is set, to check that warm matmul calls make
// none. Replacing the global operator new is the only way to see them; libstdc++'s new[],
// nothrow new and the default deletes all go through this pair and malloc/free. Skipped
// under AddressSanitizer, which provides its own allocator and checks new/delete pairing.
#if !defined(__SANITIZE_ADDRESS__)
#define TANDEM_MATMUL_COUNT_ALLOCATIONS 1
// GCC pairs the inlined replacement new with std::free in vector destructors and warns of a
// mismatch that is not there (both sides are this file's malloc/free).
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
namespace {
std::atomic<bool> g_counting{false};
std::atomic<int64_t> g_allocations{0};
}  // namespace

void* operator new(std::size_t size) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(size ? size : 1)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
#endif

using namespace tandem::kernels;
using namespace tandem::kernels::cpu;

namespace {

// Weights plus k_max_x activation rows; a test runs it with the first n_x <= k_max_x rows,
// so the (slow to quantize) weights are shared across n_x.
constexpr int64_t k_max_x = 40;  // at least k_expand_min_act_rows + 4

struct problem {
  weight_type wt;
  int64_t rows, cols;
  std::vector<float> x;    // k_max_x * cols activations
  std::vector<uint8_t> w;  // quantized weights
  std::vector<float> wd;   // dequantized weights, rows * cols
};

problem make_problem(weight_type wt, int64_t rows, int64_t cols, uint32_t seed) {
  problem p{wt, rows, cols, {}, {}, {}};
  p.x = tandem::test::gaussian(static_cast<size_t>(k_max_x * cols), seed, 1.0f);
  const auto wf = tandem::test::gaussian(static_cast<size_t>(rows * cols), seed + 7777, 0.05f, 0.005f);
  p.w = tandem::test::quantize_matrix(wt, wf, rows, cols);
  p.wd = tandem::test::dequantize_matrix(wt, p.w, rows, cols);
  return p;
}

// make_problem for the packed-weight tests (37 rows, 96 or 512 columns) with its packed form.
struct packed_problem {
  problem p;
  std::vector<uint8_t> packed;
};
packed_problem make_packed_problem(weight_type t, uint32_t seed) {
  const int64_t rows = 37, cols = info(t).block_elems == 256 ? 512 : 96;
  packed_problem pp{make_problem(t, rows, cols, seed), std::vector<uint8_t>(packed_bytes(t, rows, cols))};
  pack_weights(t, pp.p.w.data(), rows, cols, pp.packed.data());
  return pp;
}

std::vector<float> run(const problem& p, int64_t n_x, thread_pool* pool) {
  std::vector<float> y(static_cast<size_t>(p.rows * n_x), -7.0f);
  matmul(p.wt, p.w.data(), p.rows, p.cols, p.x.data(), n_x, y.data(), pool);
  return y;
}

bool has_offset(weight_type t) { return t == weight_type::q4_1 || t == weight_type::q5_1; }

std::vector<int64_t> cols_for(weight_type t) {
  if (info(t).block_elems == 256) return {256, 768, 2816};
  if (info(t).block_elems == 1) return {37, 64, 512, 2816};
  return {64, 96, 256, 2816};
}

// Worst-case error of one activation element after conversion to `act` (see act_quant.h):
// half a step of the 8-bit grid (with the fp16 rounding of d for Q8_0/Q8_1), or the float
// format's relative rounding.
double activation_error(weight_type act, const float* block, int64_t block_len, float xi) {
  float amax = 0;
  for (int64_t i = 0; i < block_len; ++i) amax = std::max(amax, std::fabs(block[i]));
  switch (act) {
    case weight_type::q8_0:
    case weight_type::q8_1:
      return amax * 0.0045;
    case weight_type::q8_k:
      return amax * 0.004;
    case weight_type::f16:
      return std::fabs(xi) * 4.9e-4 + 3e-8;
    case weight_type::bf16:
      return std::fabs(xi) * 3.91e-3;
    default:
      return 0.0;
  }
}

}  // namespace

TEST_SUITE("matmul") {
  TEST_CASE("isa selection") {
    tandem::test::isa_guard guard;
    CHECK(std::string(isa_name(isa::scalar)) == "scalar");
    CHECK(std::string(isa_name(isa::avx2)) == "avx2");
    CHECK(std::string(isa_name(isa::best)) == "best");
    CHECK(std::string(isa_name(isa::avx512)) == "avx512");
    set_isa(isa::best);
    CHECK(active_isa() == (isa_supported(isa::avx512) ? isa::avx512 : isa_supported(isa::avx2) ? isa::avx2 : isa::scalar));
    if (isa_supported(isa::avx512)) CHECK(isa_supported(isa::avx2));
    if (!isa_supported(isa::avx512)) CHECK_THROWS_WITH_AS(set_isa(isa::avx512), doctest::Contains("VNNI"), std::invalid_argument);
    set_isa(isa::scalar);
    CHECK(active_isa() == isa::scalar);
    if (isa_supported(isa::avx2)) {
      set_isa(isa::avx2);
      CHECK(active_isa() == isa::avx2);
    } else {
      CHECK_THROWS_AS(set_isa(isa::avx2), std::invalid_argument);
    }
  }

  TEST_CASE("every SIMD matmul path equals scalar matmul") {
    if (!isa_supported(isa::avx2)) {
      MESSAGE("skipped: this CPU lacks AVX2/FMA/F16C");
      return;
    }
    std::vector<isa> paths{isa::avx2};
    if (isa_supported(isa::avx512)) paths.push_back(isa::avx512);
    tandem::test::isa_guard guard;
    // Both paths sum the same integers per block and differ only in float accumulation
    // order: |avx2 - scalar| <= 1e-5 * sum_i |w_i * a_i| over the converted activations a
    // (for Q4_1/Q5_1 the offset terms |m| * |s| are added to that sum).
    uint32_t seed = 1;
    for (const auto t : tandem::test::computable_types()) {
      const weight_type act = activation_type(t);
      for (const int64_t rows : {1, 5, 67, 130}) {
        for (const int64_t cols : cols_for(t)) {
          const auto p = make_problem(t, rows, cols, ++seed);
          for (const int64_t n_x : {1, 3, 8}) {
            for (const isa path : paths) {
              CAPTURE(display_name(t));
              CAPTURE(isa_name(path));
              CAPTURE(rows);
              CAPTURE(cols);
              CAPTURE(n_x);
              set_isa(isa::scalar);
              const auto ys = run(p, n_x, nullptr);
              set_isa(path);
              const auto yv = run(p, n_x, nullptr);
              std::vector<uint8_t> aq(static_cast<size_t>(row_bytes(act, cols)));
              std::vector<float> ad(static_cast<size_t>(cols));
              for (int64_t r = 0; r < n_x; ++r) {
                quantize_activation_row(act, p.x.data() + r * cols, aq.data(), cols);
                dequantize_activation_row(act, aq.data(), ad.data(), cols);
                for (int64_t o = 0; o < rows; ++o) {
                  double mag = 0;
                  for (int64_t i = 0; i < cols; ++i)
                    mag += std::fabs(static_cast<double>(p.wd[static_cast<size_t>(o * cols + i)]) * ad[static_cast<size_t>(i)]);
                  if (has_offset(t)) {
                    // |m| <= the block's largest |w| (the minimum element decodes to m exactly).
                    for (int64_t b = 0; b < cols; b += 32) {
                      double wmax = 0, asum = 0;
                      for (int64_t i = b; i < b + 32; ++i) {
                        wmax = std::max(wmax, std::fabs(static_cast<double>(p.wd[static_cast<size_t>(o * cols + i)])));
                        asum += std::fabs(static_cast<double>(ad[static_cast<size_t>(i)]));
                      }
                      mag += wmax * asum * 1.001;
                    }
                  }
                  const size_t k = static_cast<size_t>(r * rows + o);
                  REQUIRE(std::fabs(static_cast<double>(yv[k]) - ys[k]) <= 1e-5 * mag);
                }
              }
            }
          }
        }
      }
    }
  }

  TEST_CASE("matmul matches a double-precision reference") {
    // Reference: sum_i W[o, i] * x[r, i] in double over the dequantized weights and the
    // original (unconverted) activations. The only approximation matmul adds is converting x
    // to the activation type, so the bound is sum_i |W[o, i]| * (worst-case conversion error
    // of x[r, i]) + 1e-5 * sum_i |W x| for float accumulation; Q4_1/Q5_1 also carry the fp16
    // rounding of each block's s (<= 2^-9 of |m| * sum |x| over the block).
    tandem::test::isa_guard guard;
    uint32_t seed = 500;
    for (const auto t : tandem::test::computable_types()) {
      const weight_type act = activation_type(t);
      const int64_t act_block = std::max<int64_t>(info(act).block_elems, 32);
      for (const int64_t cols : cols_for(t)) {
        const int64_t rows = 67;
        const auto p = make_problem(t, rows, cols, ++seed);
        for (const isa path : {isa::scalar, isa::best}) {
          set_isa(path);
          for (const int64_t n_x : {1, 3, 8}) {
            CAPTURE(isa_name(active_isa()));
            CAPTURE(display_name(t));
            CAPTURE(cols);
            CAPTURE(n_x);
            const auto y = run(p, n_x, nullptr);
            double worst_ratio = 0;
            for (int64_t r = 0; r < n_x; ++r) {
              const float* xr = p.x.data() + r * cols;
              std::vector<double> err(static_cast<size_t>(cols));
              for (int64_t i = 0; i < cols; ++i) {
                const int64_t b0 = i / act_block * act_block;
                err[static_cast<size_t>(i)] = activation_error(act, xr + b0, std::min(act_block, cols - b0), xr[i]);
              }
              for (int64_t o = 0; o < rows; ++o) {
                const float* wr = p.wd.data() + o * cols;
                double ref = 0, bound = 1e-6, mag = 0;
                for (int64_t i = 0; i < cols; ++i) {
                  ref += static_cast<double>(wr[i]) * xr[i];
                  mag += std::fabs(static_cast<double>(wr[i]) * xr[i]);
                  bound += std::fabs(static_cast<double>(wr[i])) * err[static_cast<size_t>(i)];
                }
                bound += 1e-5 * mag;
                if (has_offset(t)) {
                  for (int64_t b = 0; b < cols; b += 32) {
                    double wmax = 0, xsum = 0;
                    for (int64_t i = b; i < b + 32; ++i) {
                      wmax = std::max(wmax, std::fabs(static_cast<double>(wr[i])));
                      xsum += std::fabs(static_cast<double>(xr[i]));
                    }
                    bound += wmax * xsum * std::ldexp(1.0, -9);
                  }
                }
                const double got = y[static_cast<size_t>(r * rows + o)];
                REQUIRE(std::fabs(got - ref) <= bound);
                worst_ratio = std::max(worst_ratio, std::fabs(got - ref) / bound);
              }
            }
            // The bound is a worst case; typical errors are far inside it.
            CHECK(worst_ratio < 0.5);
          }
        }
      }
    }
  }

  TEST_CASE("thread count does not change results") {
    thread_pool one(1), two(2), four(4);
    uint32_t seed = 900;
    for (const auto t : tandem::test::computable_types()) {
      // Large enough that the pool really splits the rows (see k_min_chunk_work).
      const auto p = make_problem(t, 67, 2816, ++seed);
      for (const int64_t n_x : {1, 8}) {
        CAPTURE(display_name(t));
        CAPTURE(n_x);
        const auto y0 = run(p, n_x, nullptr);
        const auto y1 = run(p, n_x, &one);
        const auto y2 = run(p, n_x, &two);
        const auto y4 = run(p, n_x, &four);
        CHECK(y1 == y0);
        CHECK(y2 == y1);
        CHECK(y4 == y1);
      }
    }
  }

  TEST_CASE("a prefill row equals the decode of that row") {
    // Bit for bit on the row-tile kernels, and on the Q4_1/Q5_1 panels (ggml's order). The
    // other quantized types on AVX-512 take packed panels from panel_min_act_rows rows on,
    // which round differently: there the rows agree to 1e-5 of sum |w * x|.
    thread_pool pool(2);
    uint32_t seed = 1200;
    for (const auto t : tandem::test::computable_types()) {
      CAPTURE(display_name(t));
      const bool exact = active_isa() != isa::avx512 || !panel_supported(t) || has_offset(t) || 7 < panel_min_act_rows(t);
      const auto p = make_problem(t, 19, 512, ++seed);
      const auto all = run(p, 7, &pool);
      for (int64_t r = 0; r < 7; ++r) {
        std::vector<float> one(static_cast<size_t>(p.rows));
        matmul(t, p.w.data(), p.rows, p.cols, p.x.data() + r * p.cols, 1, one.data(), &pool);
        for (int64_t o = 0; o < p.rows; ++o) {
          const float a = one[static_cast<size_t>(o)], b = all[static_cast<size_t>(r * p.rows + o)];
          if (exact) {
            REQUIRE(a == b);
            continue;
          }
          double mag = 0;
          for (int64_t i = 0; i < p.cols; ++i)
            mag += std::fabs(static_cast<double>(p.wd[static_cast<size_t>(o * p.cols + i)]) * p.x[static_cast<size_t>(r * p.cols + i)]);
          REQUIRE(std::fabs(a - b) <= 1.1e-5 * mag);
        }
      }
    }
  }

  TEST_CASE("packed weights give the row layout's products, on every path and thread count") {
    // Packed panels round as the panel kernels do: within 1e-5 of sum |w * a| of the row
    // layout's results (plus Q4_1's and Q5_1's offset terms), and those two bit for bit on
    // AVX-512 and AVX2 (with and without AVX-VNNI), whose row tiles keep ggml's order.
    tandem::test::isa_guard guard;
    thread_pool pool(2);
    // Every path, the avx2 one also without AVX-VNNI where the CPU has it.
    std::vector<std::pair<isa, bool>> paths;
    for (const isa path : tandem::test::supported_isas()) {
      paths.emplace_back(path, true);
      if (path == isa::avx2 && cpu_has_avx_vnni()) paths.emplace_back(path, false);
    }
    uint32_t seed = 2000;
    for (const auto t : {weight_type::q4_0, weight_type::q4_1, weight_type::q5_0, weight_type::q5_1, weight_type::q8_0, weight_type::q4_k,
                         weight_type::q5_k, weight_type::q6_k}) {
      const auto [p, packed] = make_packed_problem(t, ++seed);
      const int64_t rows = p.rows, cols = p.cols;
      for (const auto& [path, vnni] : paths) {
        set_isa(path);
        set_avx_vnni(vnni);
        for (const int64_t n_x : {int64_t{1}, int64_t{3}, int64_t{8}, int64_t{20}, k_expand_min_act_rows + 4}) {
          CAPTURE(display_name(t));
          CAPTURE(isa_name(path));
          CAPTURE(vnni);
          CAPTURE(n_x);
          const auto want = run(p, n_x, &pool);
          std::vector<float> got(static_cast<size_t>(rows * n_x), -7.0f);
          matmul(t, packed.data(), rows, cols, p.x.data(), n_x, got.data(), &pool, weight_layout::packed);
          for (int64_t r = 0; r < n_x; ++r)
            for (int64_t o = 0; o < rows; ++o) {
              const size_t k = static_cast<size_t>(r * rows + o);
              if (has_offset(t) && path != isa::scalar) {
                REQUIRE(got[k] == want[k]);
                continue;
              }
              double mag = 0;
              for (int64_t i = 0; i < cols; ++i)
                mag += std::fabs(static_cast<double>(p.wd[static_cast<size_t>(o * cols + i)]) * p.x[static_cast<size_t>(r * cols + i)]);
              REQUIRE(std::fabs(got[k] - want[k]) <= 1.1e-5 * mag * (has_offset(t) ? 4.0 : 1.0));
            }
        }
      }
    }
    std::vector<float> y(4);
    std::vector<uint8_t> w(1024);
    CHECK_THROWS_WITH_AS(matmul(weight_type::q3_k, w.data(), 1, 256, y.data(), 1, y.data(), nullptr, weight_layout::packed),
                         doctest::Contains("Q3_K"), std::invalid_argument);
  }

  TEST_CASE("AMX products equal the AVX-512 vector kernels' bit for bit, packed and per-call panels, both orders") {
    if (!isa_supported(isa::avx512) || !cpu_has_amx()) {
      MESSAGE("skipped: this CPU (or its operating system) offers no AMX-INT8");
      return;
    }
    tandem::test::isa_guard guard;
    set_isa(isa::avx512);
    thread_pool pool(2);
    uint32_t seed = 3000;
    for (const auto t : {weight_type::q4_0, weight_type::q4_1, weight_type::q5_0, weight_type::q5_1, weight_type::q8_0, weight_type::q4_k,
                         weight_type::q5_k, weight_type::q6_k}) {
      const auto [p, packed] = make_packed_problem(t, ++seed);
      const int64_t rows = p.rows, cols = p.cols;
      for (const int64_t n_x : {int64_t{8}, int64_t{16}, int64_t{21}, k_expand_min_act_rows, k_expand_min_act_rows + 7}) {
        for (const auto layout : {weight_layout::packed, weight_layout::rows}) {
          // Packed Q4_1/Q5_1 in the tile's order take the tiles from k_expand_min_act_rows
          // rows on, where the vector path keeps the packed tile kernel.
          for (const auto order : {sum_order::ggml, sum_order::tile}) {
            if (order == sum_order::tile && !has_ggml_order(t)) continue;
            CAPTURE(display_name(t));
            CAPTURE(n_x);
            CAPTURE(layout == weight_layout::packed);
            CAPTURE(order == sum_order::tile);
            const void* w = layout == weight_layout::packed ? static_cast<const void*>(packed.data()) : p.w.data();
            std::vector<float> want(static_cast<size_t>(rows * n_x), -7.0f), got(want);
            set_amx(false);
            matmul(t, w, rows, cols, p.x.data(), n_x, want.data(), &pool, layout, order);
            set_amx(true);
            REQUIRE(amx_active());
            matmul(t, w, rows, cols, p.x.data(), n_x, got.data(), &pool, layout, order);
            CHECK(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)) == 0);
          }
        }
      }
    }
  }

  TEST_CASE("packed Q4_1/Q5_1 in the tile's order: a row's products do not depend on how many rows share the call") {
    // No expansion into ggml-order panels from k_expand_min_act_rows on: a prompt chunk and a
    // decode row of the server's arithmetic must round alike.
    if (!isa_supported(isa::avx512)) return;
    tandem::test::isa_guard guard;
    set_isa(isa::avx512);
    thread_pool pool(2);
    for (const weight_type t : {weight_type::q4_1, weight_type::q5_1}) {
      CAPTURE(display_name(t));
      const int64_t rows = 37, cols = 96, n_x = k_expand_min_act_rows + 4;
      const auto p = make_problem(t, rows, cols, 2100);
      std::vector<uint8_t> packed(packed_bytes(t, rows, cols));
      pack_weights(t, p.w.data(), rows, cols, packed.data());
      std::vector<float> all(static_cast<size_t>(rows * n_x));
      matmul(t, packed.data(), rows, cols, p.x.data(), n_x, all.data(), &pool, weight_layout::packed, sum_order::tile);
      const auto ggml = run(p, n_x, &pool);
      for (int64_t r = 0; r < n_x; ++r) {
        CAPTURE(r);
        std::vector<float> one(static_cast<size_t>(rows));
        matmul(t, packed.data(), rows, cols, p.x.data() + r * cols, 1, one.data(), &pool, weight_layout::packed, sum_order::tile);
        for (int64_t o = 0; o < rows; ++o) {
          const size_t k = static_cast<size_t>(r * rows + o);
          REQUIRE(all[k] == one[static_cast<size_t>(o)]);
          double mag = 0;
          for (int64_t i = 0; i < cols; ++i)
            mag += std::fabs(static_cast<double>(p.wd[static_cast<size_t>(o * cols + i)]) * p.x[static_cast<size_t>(r * cols + i)]);
          REQUIRE(std::fabs(all[k] - ggml[k]) <= 1.1e-5 * mag + 1e-6);
        }
      }
    }
  }

  TEST_CASE("matmul_many equals separate matmuls bit for bit") {
    // Q, K, V as in a quantized file (attn_v often has another type) and gate/up: one
    // pass over the pool must give exactly the per-matrix results, for decode and prefill,
    // inline and on a pool.
    const int64_t cols = 256;
    const std::vector<problem> ps = {make_problem(weight_type::q4_0, 67, cols, 11), make_problem(weight_type::q6_k, 16, cols, 12),
                                     make_problem(weight_type::f16, 9, cols, 13), make_problem(weight_type::q4_k, 33, cols, 14)};
    thread_pool pool(3);
    for (thread_pool* pl : {static_cast<thread_pool*>(nullptr), &pool}) {
      for (const int64_t n_x : {int64_t{1}, int64_t{5}}) {
        CAPTURE(n_x);
        std::vector<std::vector<float>> ys;
        std::vector<matmul_job> jobs;
        ys.reserve(ps.size());
        for (const auto& p : ps) {
          ys.emplace_back(static_cast<size_t>(p.rows * n_x), -7.0f);
          jobs.push_back({p.wt, p.w.data(), p.rows, ys.back().data()});
        }
        // Every problem's x is its own; matmul_many shares one x, so use the first's.
        matmul_many(jobs.data(), static_cast<int>(jobs.size()), cols, ps[0].x.data(), n_x, pl);
        for (size_t j = 0; j < ps.size(); ++j) {
          std::vector<float> alone(static_cast<size_t>(ps[j].rows * n_x), -7.0f);
          matmul(ps[j].wt, ps[j].w.data(), ps[j].rows, cols, ps[0].x.data(), n_x, alone.data(), pl);
          CAPTURE(j);
          CHECK(alone == ys[j]);
        }
      }
    }
    // Packed jobs whose activations share a form but not an offset term (Q4_0 8, Q8_0 128,
    // Q5_0 16 on per-call panels), beside tile-order Q4_1, at every row count that changes the
    // path: decode, passes of up to 8, one of 16, 16 + 4, expanded panels.
    {
      const int64_t pc = 96;
      const std::vector<problem> qs = {make_problem(weight_type::q4_0, 37, pc, 21), make_problem(weight_type::q8_0, 19, pc, 22),
                                       make_problem(weight_type::q4_1, 21, pc, 23), make_problem(weight_type::q5_0, 17, pc, 24)};
      std::vector<std::vector<uint8_t>> packed(3);
      for (size_t j = 0; j < 3; ++j) {
        packed[j].resize(packed_bytes(qs[j].wt, qs[j].rows, pc));
        pack_weights(qs[j].wt, qs[j].w.data(), qs[j].rows, pc, packed[j].data());
      }
      const int64_t max_x = k_expand_min_act_rows + 4;
      std::vector<float> x(static_cast<size_t>(max_x * pc));
      for (size_t i = 0; i < x.size(); ++i) x[i] = static_cast<float>(std::sin(0.37 * static_cast<double>(i)) * 2.0);
      for (thread_pool* pl : {static_cast<thread_pool*>(nullptr), &pool}) {
        for (const int64_t n_x : {int64_t{1}, int64_t{5}, int64_t{16}, int64_t{20}, max_x}) {
          CAPTURE(n_x);
          std::vector<std::vector<float>> ys;
          std::vector<matmul_job> jobs;
          ys.reserve(qs.size());
          for (size_t j = 0; j < qs.size(); ++j) {
            ys.emplace_back(static_cast<size_t>(qs[j].rows * n_x), -7.0f);
            if (j < 3)
              jobs.push_back(
                  {qs[j].wt, packed[j].data(), qs[j].rows, ys.back().data(), weight_layout::packed, j == 2 ? sum_order::tile : sum_order::ggml});
            else
              jobs.push_back({qs[j].wt, qs[j].w.data(), qs[j].rows, ys.back().data()});
          }
          matmul_many(jobs.data(), static_cast<int>(jobs.size()), pc, x.data(), n_x, pl);
          for (size_t j = 0; j < qs.size(); ++j) {
            CAPTURE(display_name(qs[j].wt));
            std::vector<float> alone(static_cast<size_t>(qs[j].rows * n_x), -7.0f);
            matmul(qs[j].wt, jobs[j].w, qs[j].rows, pc, x.data(), n_x, alone.data(), pl, jobs[j].layout, jobs[j].order);
            CHECK(alone == ys[j]);
          }
        }
      }
    }
    std::vector<matmul_job> five(5, {weight_type::f32, nullptr, 0, nullptr});
    CHECK_THROWS_WITH_AS(matmul_many(five.data(), 5, cols, ps[0].x.data(), 1, nullptr), doctest::Contains("at most"), std::invalid_argument);
    // A bad job is refused before any output is written.
    std::vector<float> y0(67, -7.0f);
    const matmul_job bad[2] = {{weight_type::q4_0, ps[0].w.data(), 67, y0.data()}, {weight_type::q2_k, ps[0].w.data(), 1, y0.data()}};
    CHECK_THROWS_WITH_AS(matmul_many(bad, 2, cols, ps[0].x.data(), 1, nullptr), doctest::Contains("Q2_K"), std::invalid_argument);
    CHECK(y0[0] == -7.0f);
  }

  TEST_CASE("matmul_swiglu equals matmul_many then swiglu, bit for bit") {
    // The activation runs per pool chunk on that chunk's rows: the results must not depend on
    // where chunks end, on the ISA's swiglu body or tail, on the row count's path (decode,
    // tiles, expanded panels), or on the pairing falling back when gate and up take different
    // paths (packed gate, row-layout up).
    const int64_t cols = 256, rows = 67;  // 67: the last panel and row group are partial
    const problem gate = make_problem(weight_type::q4_0, rows, cols, 31), up = make_problem(weight_type::q4_0, rows, cols, 32);
    const problem gate_k = make_problem(weight_type::q4_k, rows, cols, 33), up_k = make_problem(weight_type::q6_k, rows, cols, 34);
    std::vector<uint8_t> gate_packed(packed_bytes(gate.wt, rows, cols)), up_packed(packed_bytes(up.wt, rows, cols));
    pack_weights(gate.wt, gate.w.data(), rows, cols, gate_packed.data());
    pack_weights(up.wt, up.w.data(), rows, cols, up_packed.data());
    struct pair {
      const char* name;
      matmul_job g, u;
    };
    const pair pairs[] = {
        {"rows", {gate.wt, gate.w.data(), rows, nullptr}, {up.wt, up.w.data(), rows, nullptr}},
        {"K-quants", {gate_k.wt, gate_k.w.data(), rows, nullptr}, {up_k.wt, up_k.w.data(), rows, nullptr}},
        {"packed",
         {gate.wt, gate_packed.data(), rows, nullptr, weight_layout::packed},
         {up.wt, up_packed.data(), rows, nullptr, weight_layout::packed}},
        {"packed gate, row up", {gate.wt, gate_packed.data(), rows, nullptr, weight_layout::packed}, {up.wt, up.w.data(), rows, nullptr}},
    };
    tandem::test::isa_guard guard;
    thread_pool pool(3);
    for (const isa path : tandem::test::supported_isas()) {
      set_isa(path);
      CAPTURE(isa_name(path));
      for (const auto& pr : pairs) {
        CAPTURE(pr.name);
        for (thread_pool* pl : {static_cast<thread_pool*>(nullptr), &pool}) {
          for (const int64_t n_x : {int64_t{1}, int64_t{5}, k_max_x}) {
            CAPTURE(n_x);
            for (const swiglu_exp e : {swiglu_exp::expf, swiglu_exp::vector}) {
              CAPTURE(e == swiglu_exp::expf);
              std::vector<float> want_g(static_cast<size_t>(rows * n_x), -7.0f), want_u(want_g), got_g(want_g), got_u(want_g);
              matmul_job jobs[2] = {pr.g, pr.u};
              jobs[0].y = want_g.data();
              jobs[1].y = want_u.data();
              matmul_many(jobs, 2, cols, gate.x.data(), n_x, pl);
              if (e == swiglu_exp::expf)
                swiglu(want_g.data(), want_u.data(), rows * n_x, pl);
              else
                swiglu_fast(want_g.data(), want_u.data(), rows * n_x, pl);
              jobs[0].y = got_g.data();
              jobs[1].y = got_u.data();
              matmul_swiglu(jobs[0], jobs[1], cols, gate.x.data(), n_x, pl, e);
              CHECK(got_u == want_u);
              CHECK(got_g == want_g);
            }
          }
        }
      }
    }
    std::vector<float> y0(static_cast<size_t>(rows), -7.0f), y1(16, -7.0f);
    const matmul_job g{gate.wt, gate.w.data(), rows, y0.data()}, u{up.wt, up.w.data(), 16, y1.data()};
    CHECK_THROWS_WITH_AS(matmul_swiglu(g, u, cols, gate.x.data(), 1, nullptr, swiglu_exp::expf), doctest::Contains("67 rows, up 16"),
                         std::invalid_argument);
    CHECK(y0[0] == -7.0f);
  }

  TEST_CASE("team parts together write what the whole call writes, bit for bit, each its own rows") {
    // A decode layer on a team (thread_pool::run_team) calls every member's part of each
    // product. The parts must add up to the whole call on every ISA and path (row kernels,
    // K-quants, F16, packed, the panel path for 5 rows), write disjoint rows, and report the
    // rows of the first job each one wrote, which the caller then reads back alone.
    const int64_t cols = 256;
    const std::vector<problem> ps = {make_problem(weight_type::q4_0, 67, cols, 41), make_problem(weight_type::q6_k, 16, cols, 42),
                                     make_problem(weight_type::f16, 9, cols, 43), make_problem(weight_type::q4_k, 33, cols, 44)};
    std::vector<uint8_t> packed(packed_bytes(ps[0].wt, ps[0].rows, cols));
    pack_weights(ps[0].wt, ps[0].w.data(), ps[0].rows, cols, packed.data());
    const problem up = make_problem(weight_type::q4_0, 67, cols, 45), up_k = make_problem(weight_type::q6_k, 67, cols, 46);
    const problem gate_k = make_problem(weight_type::q4_k, 67, cols, 47);
    std::vector<uint8_t> up_packed(packed_bytes(up.wt, up.rows, cols));
    pack_weights(up.wt, up.w.data(), up.rows, cols, up_packed.data());
    tandem::test::isa_guard guard;
    for (const isa path : tandem::test::supported_isas()) {
      set_isa(path);
      CAPTURE(isa_name(path));
      for (const int64_t n_x : {int64_t{1}, int64_t{5}}) {
        CAPTURE(n_x);
        for (const bool pack_first : {false, true}) {
          CAPTURE(pack_first);
          std::vector<std::vector<float>> want, got;
          std::vector<matmul_job> jobs;
          for (size_t j = 0; j < ps.size(); ++j) {
            want.emplace_back(static_cast<size_t>(ps[j].rows * n_x), -7.0f);
            jobs.push_back({ps[j].wt, ps[j].w.data(), ps[j].rows, want.back().data()});
          }
          if (pack_first) jobs[0] = {ps[0].wt, packed.data(), ps[0].rows, want[0].data(), weight_layout::packed};
          matmul_many(jobs.data(), static_cast<int>(jobs.size()), cols, ps[0].x.data(), n_x, nullptr);
          for (const int count : {1, 2, 3, 5}) {
            CAPTURE(count);
            got = std::vector<std::vector<float>>(ps.size());
            for (size_t j = 0; j < ps.size(); ++j) {
              got[j].assign(static_cast<size_t>(ps[j].rows * n_x), -7.0f);
              jobs[j].y = got[j].data();
            }
            int64_t next_row = 0;
            for (int i = 0; i < count; ++i) {
              const row_span rows = matmul_many_part(jobs.data(), static_cast<int>(jobs.size()), cols, ps[0].x.data(), n_x, {i, count});
              CHECK(rows.begin == next_row);  // in order, no gap, no overlap
              CHECK(rows.end >= rows.begin);
              next_row = rows.end;
            }
            CHECK(next_row == ps[0].rows);
            for (size_t j = 0; j < ps.size(); ++j) {
              CAPTURE(j);
              CHECK(got[j] == want[j]);
            }
          }
        }
        // Gate and up with their SwiGLU: paired (same path) and not (packed gate, row up).
        struct pair {
          const char* name;
          matmul_job g, u;
        };
        const pair pairs[] = {
            {"rows", {ps[0].wt, ps[0].w.data(), 67, nullptr}, {up.wt, up.w.data(), 67, nullptr}},
            {"K-quants", {gate_k.wt, gate_k.w.data(), 67, nullptr}, {up_k.wt, up_k.w.data(), 67, nullptr}},
            {"packed", {ps[0].wt, packed.data(), 67, nullptr, weight_layout::packed}, {up.wt, up_packed.data(), 67, nullptr, weight_layout::packed}},
            {"packed gate, row up", {ps[0].wt, packed.data(), 67, nullptr, weight_layout::packed}, {up.wt, up.w.data(), 67, nullptr}},
        };
        for (const auto& pr : pairs) {
          CAPTURE(pr.name);
          for (const swiglu_exp e : {swiglu_exp::expf, swiglu_exp::vector}) {
            CAPTURE(e == swiglu_exp::expf);
            std::vector<float> want_g(static_cast<size_t>(67 * n_x), -7.0f), want_u(want_g);
            matmul_job g = pr.g, u = pr.u;
            g.y = want_g.data();
            u.y = want_u.data();
            matmul_swiglu(g, u, cols, ps[0].x.data(), n_x, nullptr, e);
            for (const int count : {2, 3}) {
              CAPTURE(count);
              std::vector<float> got_g(want_g.size(), -7.0f), got_u(want_g.size(), -7.0f);
              g.y = got_g.data();
              u.y = got_u.data();
              int64_t next_row = 0;
              for (int i = 0; i < count; ++i) {
                const row_span rows = matmul_swiglu_part(g, u, cols, ps[0].x.data(), n_x, {i, count}, e);
                CHECK(rows.begin == next_row);
                next_row = rows.end;
              }
              CHECK(next_row == 67);
              CHECK(got_u == want_u);
              CHECK(got_g == want_g);
            }
          }
        }
      }
    }
    // No columns: the parts zero the outputs between them.
    std::vector<float> y0(8, -7.0f), y1(3, -7.0f);
    const matmul_job empty[2] = {{weight_type::f32, nullptr, 8, y0.data()}, {weight_type::f32, nullptr, 3, y1.data()}};
    for (int i = 0; i < 3; ++i) matmul_many_part(empty, 2, 0, ps[0].x.data(), 1, {i, 3});
    CHECK(y0 == std::vector<float>(8, 0.0f));
    CHECK(y1 == std::vector<float>(3, 0.0f));
    // A part outside its team is refused before anything is written.
    std::vector<float> y(67, -7.0f);
    const matmul_job one{ps[0].wt, ps[0].w.data(), 67, y.data()};
    for (const team_part bad : {team_part{2, 2}, team_part{-1, 2}, team_part{0, 0}}) {
      CHECK_THROWS_WITH_AS(matmul_many_part(&one, 1, cols, ps[0].x.data(), 1, bad), doctest::Contains("team part"), std::invalid_argument);
      CHECK_THROWS_AS(matmul_swiglu_part(one, one, cols, ps[0].x.data(), 1, bad, swiglu_exp::expf), std::invalid_argument);
    }
    CHECK(y[0] == -7.0f);
  }

  TEST_CASE("chunks carry the same work whether a group is a panel or a row group") {
    // Groups of the panel paths hold k_panel_rows rows, those of the row kernels
    // k_max_weight_rows: a chunk of either is about the same number of multiply-adds, so a
    // small decode product still splits. (Counting panels as row groups once left a 576 x 576
    // packed product, 36 panels, on one thread.)
    for (const int64_t cols : {576, 1024, 1536, 2816, 4096})
      for (const int64_t n_x : {1, 4, 16}) {
        CAPTURE(cols);
        CAPTURE(n_x);
        const int64_t panel_macs = matmul_chunk_groups(cols, n_x, k_panel_rows) * k_panel_rows * cols * n_x;
        const int64_t row_macs = matmul_chunk_groups(cols, n_x, k_max_weight_rows) * k_max_weight_rows * cols * n_x;
        CHECK(panel_macs <= row_macs + k_panel_rows * cols * n_x);
        CHECK(row_macs <= panel_macs + k_panel_rows * cols * n_x);
      }
    // The decode products of a 135M model (dim 576, FFN 1536) split into several chunks.
    CHECK(576 / k_panel_rows / matmul_chunk_groups(576, 1, k_panel_rows) >= 4);
    CHECK(576 / k_panel_rows / matmul_chunk_groups(1536, 1, k_panel_rows) >= 4);
    CHECK(matmul_chunk_groups(1, 1, k_panel_rows) >= 1);
    CHECK(matmul_chunk_groups(1, 1, 0) >= 1);
  }

  TEST_CASE("shapes and errors") {
    std::vector<uint8_t> w(4096);
    std::vector<float> x(512), y(64, 3.0f);
    CHECK_THROWS_WITH_AS(matmul(weight_type::q4_k, w.data(), 2, 100, x.data(), 1, y.data(), nullptr), doctest::Contains("Q4_K"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(matmul(weight_type::q2_k, w.data(), 2, 256, x.data(), 1, y.data(), nullptr), doctest::Contains("Q2_K"),
                         std::invalid_argument);
    matmul(weight_type::q8_0, w.data(), 0, 256, x.data(), 1, y.data(), nullptr);
    matmul(weight_type::q8_0, w.data(), 2, 256, x.data(), 0, y.data(), nullptr);
    CHECK(y[0] == 3.0f);
  }

  TEST_CASE("warm calls do not allocate") {
#if defined(TANDEM_MATMUL_COUNT_ALLOCATIONS)
    thread_pool pool(2);
    uint32_t seed = 1500;
    // One type per activation conversion (Q8_0, Q8_K, F16, none), on a shape the pool splits.
    for (const auto t : {weight_type::q4_0, weight_type::q4_k, weight_type::f16, weight_type::f32}) {
      CAPTURE(display_name(t));
      const auto p = make_problem(t, 67, 2816, ++seed);
      std::vector<float> y(static_cast<size_t>(p.rows * k_max_x));
      for (thread_pool* with : {static_cast<thread_pool*>(nullptr), &pool}) {
        // Largest first: the caller's scratch is then big enough. 8: a batch each thread of
        // the pool converts for itself, into buffers the warm-up call grows.
        for (const int64_t n_x : {k_max_x, int64_t{8}, int64_t{1}}) {
          CAPTURE(n_x);
          matmul(t, p.w.data(), p.rows, p.cols, p.x.data(), n_x, y.data(), with);  // warms the scratch
          g_allocations.store(0);
          g_counting.store(true);
          for (int i = 0; i < 3; ++i) matmul(t, p.w.data(), p.rows, p.cols, p.x.data(), n_x, y.data(), with);
          g_counting.store(false);
          CHECK(g_allocations.load() == 0);
        }
      }
    }
#else
    MESSAGE("skipped: allocation counting is off under AddressSanitizer");
#endif
  }
}
