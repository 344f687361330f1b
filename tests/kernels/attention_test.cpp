#include "kernels/cpu/ops.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <algorithm>
#include <random>
#include <vector>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/quants.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/test_support.h"
#include "tests/kernels/attention_test_util.h"
#include "tests/kernels/kernel_test_util.h"

using namespace tandem::kernels::cpu;
using namespace tandem::test::attention_util;

TEST_SUITE("attention") {
  TEST_CASE("every path matches a double-precision reference") {
    tandem::test::isa_guard guard;
    std::mt19937 rng(777);
    thread_pool pool2(2);
    for (const auto& sh : k_shapes)
      for (kv_type kt : {kv_type::f32, kv_type::f16}) {
        CAPTURE(sh.n_heads);
        CAPTURE(sh.n_kv_heads);
        CAPTURE(sh.head_dim);
        CAPTURE(sh.n_q);
        CAPTURE(sh.pos0);
        CAPTURE(int(kt));
        auto p = make_problem(rng, sh, kt);
        const bool f16 = kt == kv_type::f16;
        const auto ref = reference_attention(p.q, sh.n_q, sh.pos0, p.k, p.v, sh.n_heads, sh.n_kv_heads, sh.head_dim, p.scale, f16);
        // The f16 arithmetic still lands close to exact attention over the same cache.
        const auto exact = f16 ? reference_attention(p.q, sh.n_q, sh.pos0, p.k, p.v, sh.n_heads, sh.n_kv_heads, sh.head_dim, p.scale, false) : ref;
        for (const isa path : tandem::test::supported_isas())
          for (thread_pool* pool : {static_cast<thread_pool*>(nullptr), &pool2}) {
            CAPTURE(isa_name(path));
            CAPTURE(pool != nullptr);
            set_isa(path);
            const auto out = run(p, sh, kt, pool);
            // f16: an accumulator value whose float and double results straddle an f16 rounding
            // boundary moves by one f16 ulp (~1e-3 of values of order 1), hence the looser bound.
            const double tol = f16 ? 2e-3 : 2e-6;
            double worst = 0, drift = 0;
            for (size_t i = 0; i < out.size(); ++i) {
              worst = std::max(worst, std::fabs(out[i] - ref[i]));
              drift = std::max(drift, std::fabs(out[i] - exact[i]));
            }
            CHECK(worst <= tol);
            CHECK(drift <= 1e-2);
          }
      }
  }

  TEST_CASE("the SIMD paths reproduce the scalar reference") {
    // attention_impl.h: every path performs the reference's operations in its order, so on an
    // f16 cache the results are identical; on an f32 cache only softmax's exponentials differ
    // (expf against a vector e^x within 2 ulp), a few float ulps of the output.
    tandem::test::isa_guard guard;
    std::mt19937 rng(4242);
    thread_pool pool2(2), pool4(4);  // 4 threads split a KV head's group over two tasks
    for (const auto& sh : k_shapes)
      for (kv_type kt : {kv_type::f32, kv_type::f16}) {
        CAPTURE(sh.n_heads);
        CAPTURE(sh.n_kv_heads);
        CAPTURE(sh.head_dim);
        CAPTURE(sh.n_q);
        CAPTURE(sh.pos0);
        CAPTURE(int(kt));
        auto p = make_problem(rng, sh, kt);
        set_isa(isa::scalar);
        const auto want = run(p, sh, kt, nullptr);
        for (const isa path : tandem::test::supported_isas()) {
          if (path == isa::scalar) continue;
          for (thread_pool* pool : {static_cast<thread_pool*>(nullptr), &pool2, &pool4}) {
            CAPTURE(isa_name(path));
            CAPTURE(pool != nullptr);
            set_isa(path);
            const auto got = run(p, sh, kt, pool);
            if (kt == kv_type::f16) {
              size_t differing = 0;
              for (size_t i = 0; i < got.size(); ++i) differing += got[i] != want[i];
              CHECK(differing == 0);
            } else {
              double worst = 0;
              for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, double(std::fabs(got[i] - want[i])));
              CHECK(worst <= 1e-6);
            }
          }
        }
      }
  }

  TEST_CASE("f16 prompt rows attended several to a task equal each row attended alone, bit for bit") {
    // On an f16 cache a long prompt's rows go k_attention_task_rows to a task (one widening of
    // each key block for all of them); tails of fewer rows and every thread count must leave
    // each row's result as a one-row call gives it, on every path.
    tandem::test::isa_guard guard;
    std::mt19937 rng(515);
    thread_pool pool2(2), pool3(3);
    for (const shape sh : {shape{16, 4, 64, 37, 13}, shape{8, 2, 64, 42, 0}, shape{6, 3, 24, 19, 5}}) {
      CAPTURE(sh.n_q);
      auto p = make_problem(rng, sh, kv_type::f16);
      const int64_t row_floats = int64_t(sh.n_heads) * sh.head_dim;
      for (const isa path : tandem::test::supported_isas()) {
        CAPTURE(isa_name(path));
        set_isa(path);
        std::vector<float> alone(p.q.size(), -1.0f);
        for (int64_t r = 0; r < sh.n_q; ++r)
          attention(p.q.data() + r * row_floats, 1, sh.pos0 + r, p.k.data(), p.v.data(), kv_type::f16, sh.n_heads, sh.n_kv_heads, sh.head_dim,
                    p.scale, alone.data() + r * row_floats, nullptr);
        for (thread_pool* pool : {static_cast<thread_pool*>(nullptr), &pool2, &pool3}) {
          CAPTURE(pool != nullptr);
          CHECK(run(p, sh, kv_type::f16, pool) == alone);
        }
      }
    }
  }

  TEST_CASE("f16 online softmax: ties, a new maximum at every key and non-finite keys as the scalar reference") {
    // The AVX-512 path finds a block's maxima and weights 16 keys at a time; the scalar path
    // goes key by key. Scores that tie, scores that set a new maximum at every key (each
    // rescaling the accumulators), an infinite key and, later, a NaN one must give the same
    // bits (NaN for NaN) on every path.
    tandem::test::isa_guard guard;
    std::mt19937 rng(808);
    const shape sh{4, 2, 32, 12, 40};
    const int64_t n_keys = sh.pos0 + sh.n_q, row = int64_t(sh.n_kv_heads) * sh.head_dim;
    auto p = make_problem(rng, sh, kv_type::f16);
    // Every query near one direction u, so that keys along u score by their length.
    const auto u = random_vector(rng, size_t(sh.head_dim), 1.0f);
    const auto noise = random_vector(rng, p.q.size(), 0.05f);
    for (size_t i = 0; i < p.q.size(); ++i) p.q[i] = u[i % size_t(sh.head_dim)] + noise[i];
    auto keys = random_vector(rng, size_t(n_keys * row), 1.0f);
    auto key = [&](int64_t t, int64_t e) -> float& { return keys[size_t(t * row + e)]; };
    for (int64_t t = 0; t < n_keys; ++t)
      for (int64_t e = 0; e < row; ++e) {
        const float along = u[size_t(e % sh.head_dim)];
        if (t >= 3 && t < 11) key(t, e) = 0.25f * along;                   // ties
        if (t >= 17 && t < 37) key(t, e) = 0.05f * float(t - 16) * along;  // rising
      }
    key(44, 0) = std::numeric_limits<float>::infinity();         // one KV head's score of +-inf
    key(49, row - 1) = std::numeric_limits<float>::quiet_NaN();  // the other's NaN, for the last rows
    p.k.store(0, keys, n_keys);
    set_isa(isa::scalar);
    const auto want = run(p, sh, kv_type::f16, nullptr);
    size_t nan_rows = 0;
    for (const float x : want) nan_rows += std::isnan(x);
    CHECK(nan_rows > 0);  // the NaN key reached the rows after it
    thread_pool pool2(2);
    for (const isa path : tandem::test::supported_isas()) {
      CAPTURE(isa_name(path));
      set_isa(path);
      for (thread_pool* pool : {static_cast<thread_pool*>(nullptr), &pool2}) {
        CAPTURE(pool != nullptr);
        const auto got = run(p, sh, kv_type::f16, pool);
        size_t differing = 0;
        for (size_t i = 0; i < got.size(); ++i)
          differing += !(std::memcmp(&got[i], &want[i], sizeof(float)) == 0 || (std::isnan(got[i]) && std::isnan(want[i])));
        CHECK(differing == 0);
      }
    }
  }

  TEST_CASE("attention_many equals one attention call per run, bit for bit") {
    // Runs of one shape family (same heads) but different lengths and positions: a batched
    // decode step (one row each) and a mix with prefill chunks, on a pool and inline.
    std::mt19937 rng(77);
    thread_pool pool(3);
    for (const kv_type kt : {kv_type::f16, kv_type::f32, kv_type::q8_0, kv_type::q4_0}) {
      for (const std::vector<std::pair<int64_t, int64_t>>& lens :
           {std::vector<std::pair<int64_t, int64_t>>{{1, 0}, {1, 5}, {1, 40}, {1, 17}, {1, 3}, {1, 99}, {1, 1}, {1, 64}},
            std::vector<std::pair<int64_t, int64_t>>{{7, 0}, {1, 30}, {3, 12}}}) {
        auto [ps, shapes] = make_runs(rng, lens, kt);
        for (thread_pool* pl : {static_cast<thread_pool*>(nullptr), &pool}) {
          std::vector<std::vector<float>> outs;
          std::vector<attention_run> runs;
          outs.reserve(ps.size());
          for (size_t i = 0; i < ps.size(); ++i) {
            outs.emplace_back(ps[i].q.size(), -1.0f);
            runs.push_back({ps[i].q.data(), shapes[i].n_q, shapes[i].pos0, ps[i].k.data(), ps[i].v.data(), outs.back().data()});
          }
          attention_many(runs.data(), static_cast<int64_t>(runs.size()), kt, 8, 2, 64, ps[0].scale, pl);
          for (size_t i = 0; i < ps.size(); ++i) {
            CAPTURE(i);
            CHECK(outs[i] == run(ps[i], shapes[i], kt, pl));
          }
        }
      }
    }
  }

  TEST_CASE("team parts of attention_many together write its result, bit for bit") {
    // One sequence's decode (one row: each member takes a share of its query heads, which may
    // start or end inside a KV head's group: 8 heads on 2 KV heads, and 9 on 3 as SmolLM2), a
    // batched decode step and a prompt chunk beside decode rows, each cut into 1..4 parts run
    // one after another on this thread.
    std::mt19937 rng(78);
    tandem::test::isa_guard guard;
    using lens_t = std::vector<std::pair<int64_t, int64_t>>;
    struct case_t {
      lens_t lens;
      int n_heads, n_kv_heads;
    };
    for (const isa path : tandem::test::supported_isas()) {
      set_isa(path);
      CAPTURE(isa_name(path));
      for (const kv_type kt : {kv_type::f16, kv_type::f32, kv_type::q8_0, kv_type::q4_0}) {
        for (const case_t& c : {case_t{lens_t{{1, 37}}, 8, 2}, case_t{lens_t{{1, 37}}, 9, 3}, case_t{lens_t{{1, 0}}, 9, 3},
                                case_t{lens_t{{1, 0}, {1, 5}, {1, 40}, {1, 17}, {1, 3}}, 8, 2}, case_t{lens_t{{7, 0}, {1, 30}, {3, 12}}, 8, 2}}) {
          CAPTURE(c.n_heads);
          const int n_heads = c.n_heads, n_kv_heads = c.n_kv_heads;
          auto [ps, shapes] = make_runs(rng, c.lens, kt, n_heads, n_kv_heads);
          auto runs_into = [&](std::vector<std::vector<float>>& outs) {
            outs.clear();
            outs.reserve(ps.size());
            std::vector<attention_run> runs;
            for (size_t i = 0; i < ps.size(); ++i) {
              outs.emplace_back(ps[i].q.size(), -1.0f);
              runs.push_back({ps[i].q.data(), shapes[i].n_q, shapes[i].pos0, ps[i].k.data(), ps[i].v.data(), outs.back().data()});
            }
            return runs;
          };
          std::vector<std::vector<float>> want, got;
          const auto whole = runs_into(want);
          attention_many(whole.data(), static_cast<int64_t>(whole.size()), kt, n_heads, n_kv_heads, 64, ps[0].scale, nullptr);
          for (const int count : {1, 2, 3, 4}) {
            CAPTURE(count);
            const auto parts = runs_into(got);
            for (int i = 0; i < count; ++i)
              attention_many_part(parts.data(), static_cast<int64_t>(parts.size()), kt, n_heads, n_kv_heads, 64, ps[0].scale, {i, count});
            CHECK(got == want);
          }
        }
      }
    }
    std::vector<float> q(64), out(64, -1.0f);
    std::vector<float> kv(64);
    const attention_run one{q.data(), 1, 0, kv.data(), kv.data(), out.data()};
    CHECK_THROWS_WITH_AS(attention_many_part(&one, 1, kv_type::f32, 1, 1, 64, 1.0f, {1, 1}), doctest::Contains("team part"), std::invalid_argument);
    CHECK(out[0] == -1.0f);
  }

  TEST_CASE("a paged cache gives the contiguous result bit for bit, on every path") {
    // The rows of each problem copied into blocks of a pool in a scrambled order, with a gap
    // between blocks; every path must read position p from block table[p / block_tokens], the
    // exact path and the prompt rows' tiles (a decode row's tile reads its keys and values straight
    // from the cache).
    tandem::test::isa_guard guard;
    std::mt19937 rng(4242);
    thread_pool pool(2);
    for (const kv_type kt : {kv_type::f16, kv_type::f32}) {
      for (const int64_t bt : {16, 32}) {
        for (const shape sh : {shape{8, 2, 64, 1, 70}, shape{4, 4, 40, 9, 23}, shape{6, 3, 16, 33, 0}, shape{16, 4, 64, 1, 50}}) {
          CAPTURE(bt);
          CAPTURE(sh.head_dim);
          problem p = make_problem(rng, sh, kt);
          const int64_t row = int64_t(sh.n_kv_heads) * sh.head_dim;
          const int64_t n_keys = sh.pos0 + sh.n_q;
          const int64_t n_blocks = (n_keys + bt - 1) / bt;
          const size_t elem = kt == kv_type::f32 ? 4 : 2;
          const int64_t stride = bt * row + 8;  // elements per block, with a gap
          std::vector<int32_t> table(static_cast<size_t>(n_blocks));
          for (int64_t b = 0; b < n_blocks; ++b) table[size_t(b)] = int32_t((b * 5 + 3) % (n_blocks + 4));
          std::vector<unsigned char> kpool(size_t((n_blocks + 4) * stride) * elem, 0xFF), vpool(kpool.size(), 0xFF);
          for (int64_t pos = 0; pos < n_keys; ++pos) {
            const size_t at = size_t(table[size_t(pos / bt)] * stride + (pos % bt) * row) * elem;
            std::memcpy(kpool.data() + at, static_cast<unsigned char*>(p.k.data()) + size_t(pos * row) * elem, size_t(row) * elem);
            std::memcpy(vpool.data() + at, static_cast<unsigned char*>(p.v.data()) + size_t(pos * row) * elem, size_t(row) * elem);
          }
          for (const isa path : tandem::test::supported_isas()) {
            CAPTURE(static_cast<int>(path));
            set_isa(path);
            const auto want = run(p, sh, kt, &pool);
            std::vector<float> out(p.q.size(), -1.0f);
            attention_run r{p.q.data(), sh.n_q, sh.pos0, kpool.data(), vpool.data(), out.data(), {table.data(), bt, stride * int64_t(elem)}};
            attention_many(&r, 1, kt, sh.n_heads, sh.n_kv_heads, sh.head_dim, p.scale, &pool);
            CHECK(out == want);
            // On one thread a decode row's tile takes every KV head (up to 4), on two it is split.
            for (thread_pool* pl : {static_cast<thread_pool*>(nullptr), &pool}) {
              std::vector<float> want_prompt(p.q.size(), -1.0f), got_prompt(p.q.size(), -2.0f);
              attention_run c{p.q.data(), sh.n_q, sh.pos0, p.k.data(), p.v.data(), want_prompt.data()};
              c.prompt_rows = sh.n_q;
              attention_many(&c, 1, kt, sh.n_heads, sh.n_kv_heads, sh.head_dim, p.scale, pl);
              r.out = got_prompt.data();
              r.prompt_rows = sh.n_q;
              attention_many(&r, 1, kt, sh.n_heads, sh.n_kv_heads, sh.head_dim, p.scale, pl);
              CHECK(got_prompt == want_prompt);
            }
          }
        }
      }
    }
  }

  TEST_CASE("prompt rows: close to exact attention on every shape, f32 arithmetic where AVX-512 or AVX2 runs them") {
    tandem::test::isa_guard guard;
    std::mt19937 rng(31337);
    thread_pool pool2(2);
    std::vector<shape> shapes(std::begin(k_shapes), std::end(k_shapes));
    shapes.push_back({14, 2, 64, 9, 40});  // GQA 7: tiles of 2 rows x 7 heads
    shapes.push_back({32, 1, 64, 5, 20});  // GQA 32: a KV head's heads split over two tiles
    shapes.push_back({4, 1, 256, 3, 50});  // wide heads
    shapes.push_back({16, 4, 64, 70, 0});  // a prompt chunk as the 250M model's
    for (const auto& sh : shapes)
      for (kv_type kt : {kv_type::f32, kv_type::f16}) {
        CAPTURE(sh.n_heads);
        CAPTURE(sh.n_kv_heads);
        CAPTURE(sh.head_dim);
        CAPTURE(sh.n_q);
        CAPTURE(sh.pos0);
        CAPTURE(int(kt));
        auto p = make_problem(rng, sh, kt);
        const auto exact = reference_attention(p.q, sh.n_q, sh.pos0, p.k, p.v, sh.n_heads, sh.n_kv_heads, sh.head_dim, p.scale, false);
        for (const isa path : tandem::test::supported_isas())
          for (thread_pool* pool : {static_cast<thread_pool*>(nullptr), &pool2}) {
            CAPTURE(isa_name(path));
            set_isa(path);
            std::vector<float> out(p.q.size(), -1.0f);
            attention_run r{p.q.data(), sh.n_q, sh.pos0, p.k.data(), p.v.data(), out.data()};
            r.prompt_rows = sh.n_q;
            attention_many(&r, 1, kt, sh.n_heads, sh.n_kv_heads, sh.head_dim, p.scale, pool);
            // Elsewhere (scalar) the rows take the exact path (the f16 contract on an f16 cache).
            const bool tiled = path == isa::avx512 || path == isa::avx2;
            const double tol = tiled ? 2e-5 : kt == kv_type::f16 ? 1e-2 : 2e-6;
            double worst = 0;
            for (size_t i = 0; i < out.size(); ++i) worst = std::max(worst, std::fabs(out[i] - exact[i]));
            CHECK(worst <= tol);
          }
      }
  }

  TEST_CASE("prompt rows give the same result bit for bit however the prompt is chunked and batched") {
    std::mt19937 rng(99);
    thread_pool pool(3);
    for (const kv_type kt : {kv_type::f16, kv_type::f32}) {
      const shape whole{16, 4, 64, 45, 0};
      problem p = make_problem(rng, whole, kt);
      problem other = make_problem(rng, shape{16, 4, 64, 1, 30}, kt);
      std::vector<float> want(p.q.size(), -1.0f);
      attention_run all{p.q.data(), whole.n_q, 0, p.k.data(), p.v.data(), want.data()};
      all.prompt_rows = whole.n_q;
      attention_many(&all, 1, kt, 16, 4, 64, p.scale, nullptr);
      const int64_t row = 16 * 64;
      for (const std::vector<int64_t>& cuts :
           {std::vector<int64_t>{0, 1, 2, 45}, std::vector<int64_t>{0, 5, 21, 45}, std::vector<int64_t>{0, 16, 17, 40, 45}})
        for (thread_pool* pl : {static_cast<thread_pool*>(nullptr), &pool}) {
          std::vector<float> got(p.q.size(), -1.0f), side(other.q.size(), -1.0f);
          for (size_t c = 0; c + 1 < cuts.size(); ++c) {
            // Each chunk beside a decode row of another sequence, as in a mixed engine pass.
            const int64_t a = cuts[c], n = cuts[c + 1] - cuts[c];
            attention_run runs[2] = {{other.q.data(), 1, 30, other.k.data(), other.v.data(), side.data()},
                                     {p.q.data() + a * row, n, a, p.k.data(), p.v.data(), got.data() + a * row}};
            runs[1].prompt_rows = n;
            attention_many(runs, 2, kt, 16, 4, 64, p.scale, pl);
          }
          CHECK(got == want);
          CHECK(side == run(other, shape{16, 4, 64, 1, 30}, kt, pl));  // the decode row takes the exact path
        }
      // Prompt rows first, then generated rows: those equal the exact path bit for bit.
      std::vector<float> mixed(p.q.size(), -1.0f);
      attention_run m{p.q.data(), whole.n_q, 0, p.k.data(), p.v.data(), mixed.data()};
      m.prompt_rows = 40;
      attention_many(&m, 1, kt, 16, 4, 64, p.scale, &pool);
      const auto exact = run(p, whole, kt, &pool);
      CHECK(std::equal(mixed.begin(), mixed.begin() + 40 * row, want.begin()));
      CHECK(std::equal(mixed.begin() + 40 * row, mixed.end(), exact.begin() + 40 * row));
    }
  }

  TEST_CASE("decode rows in tiles of several KV heads equal the prompt's rows bit for bit") {
    // One row per run fills a tile with 2 or 4 KV heads (interleaved keys, per-lane KV head);
    // the whole prompt tiles rows of one KV head. Every lane must come out the same.
    tandem::test::isa_guard guard;
    for (const isa path : {isa::avx512, isa::avx2}) {
      if (!isa_supported(path)) continue;
      CAPTURE(isa_name(path));
      set_isa(path);
      std::mt19937 rng(4242);
      thread_pool pool2(2);
      const shape shapes[] = {
          {16, 4, 64, 37, 0},  // the 250M model: 4 KV heads of 4 heads per tile
          {9, 3, 64, 20, 0},   // SmolLM2-135M: 3 KV heads in tiles of period 4 (AVX-512) or 2 (AVX2)
          {14, 2, 64, 18, 0},  // GQA 7: period 2
          {6, 6, 40, 21, 0},   // no GQA, head_dim with a tail: tiles of 4 and 2 KV heads
          {8, 8, 128, 17, 0},  // no GQA, wide heads
          {32, 1, 64, 5, 0},   // GQA 32: heads split over tiles, one KV head per tile
      };
      for (const auto& sh : shapes)
        for (kv_type kt : {kv_type::f32, kv_type::f16}) {
          CAPTURE(sh.n_heads);
          CAPTURE(sh.n_kv_heads);
          CAPTURE(sh.head_dim);
          CAPTURE(int(kt));
          problem p = make_problem(rng, sh, kt);
          const int64_t row = int64_t(sh.n_heads) * sh.head_dim;
          std::vector<float> want(p.q.size(), -1.0f);
          attention_run all{p.q.data(), sh.n_q, 0, p.k.data(), p.v.data(), want.data()};
          all.prompt_rows = sh.n_q;
          attention_many(&all, 1, kt, sh.n_heads, sh.n_kv_heads, sh.head_dim, p.scale, nullptr);
          for (int64_t rows_per_run : {1, 2})
            for (thread_pool* pl : {static_cast<thread_pool*>(nullptr), &pool2}) {
              CAPTURE(rows_per_run);
              // Every row (pair of rows) a run of its own in one call: a batched decode step.
              std::vector<float> batched(p.q.size(), -1.0f);
              std::vector<attention_run> runs;
              for (int64_t a = 0; a < sh.n_q; a += rows_per_run) {
                const int64_t n = std::min(rows_per_run, sh.n_q - a);
                runs.push_back({p.q.data() + a * row, n, a, p.k.data(), p.v.data(), batched.data() + a * row});
                runs.back().prompt_rows = n;
              }
              attention_many(runs.data(), int64_t(runs.size()), kt, sh.n_heads, sh.n_kv_heads, sh.head_dim, p.scale, pl);
              CHECK(batched == want);
              // The same rows one call each: a single sequence's decode.
              std::vector<float> single(p.q.size(), -1.0f);
              for (auto r : runs) {
                r.out = single.data() + (r.q - p.q.data());
                attention_many(&r, 1, kt, sh.n_heads, sh.n_kv_heads, sh.head_dim, p.scale, pl);
              }
              CHECK(single == want);
            }
        }
    }
  }

  TEST_CASE("prompt rows: the AVX2 kernel gives the AVX-512 kernel's bits") {
    // Runs where a CPU has both paths: the 8-lane tiles keep the 16-lane tiles' key blocks and
    // every lane's arithmetic, so tiles of different sizes must agree bit for bit.
    if (!isa_supported(isa::avx512) || !isa_supported(isa::avx2)) return;
    tandem::test::isa_guard guard;
    std::mt19937 rng(8080);
    thread_pool pool2(2);
    const shape shapes[] = {{16, 4, 64, 37, 0}, {9, 3, 64, 20, 5}, {6, 6, 40, 21, 0}, {4, 1, 256, 3, 50}};
    for (const auto& sh : shapes)
      for (kv_type kt : {kv_type::f32, kv_type::f16}) {
        CAPTURE(sh.n_heads);
        CAPTURE(sh.head_dim);
        CAPTURE(int(kt));
        problem p = make_problem(rng, sh, kt);
        std::vector<float> out[2];
        const isa paths[2] = {isa::avx512, isa::avx2};
        for (int i = 0; i < 2; ++i) {
          set_isa(paths[i]);
          out[i].assign(p.q.size(), -1.0f);
          attention_run r{p.q.data(), sh.n_q, sh.pos0, p.k.data(), p.v.data(), out[i].data()};
          r.prompt_rows = sh.n_q;
          attention_many(&r, 1, kt, sh.n_heads, sh.n_kv_heads, sh.head_dim, p.scale, &pool2);
        }
        CHECK(out[0] == out[1]);
      }
  }

  TEST_CASE("prompt rows: a non-finite value at a later position does not reach earlier rows") {
    std::mt19937 rng(5150);
    for (const kv_type kt : {kv_type::f32, kv_type::f16}) {
      const shape sh{4, 1, 32, 20, 0};  // 4 heads on one KV head: tiles of 4 rows
      problem p = make_problem(rng, sh, kt);
      const int64_t bad = 13;
      std::vector<float> row(32, std::numeric_limits<float>::infinity());
      p.v.store(bad, row, 1);
      std::vector<float> full(p.q.size(), -1.0f), head(p.q.size(), -1.0f);
      attention_run all{p.q.data(), sh.n_q, 0, p.k.data(), p.v.data(), full.data()};
      all.prompt_rows = sh.n_q;
      attention_many(&all, 1, kt, 4, 1, 32, p.scale, nullptr);
      attention_run first{p.q.data(), bad, 0, p.k.data(), p.v.data(), head.data()};
      first.prompt_rows = bad;
      attention_many(&first, 1, kt, 4, 1, 32, p.scale, nullptr);
      const size_t n = static_cast<size_t>(bad * 4 * 32);
      CHECK(std::equal(full.begin(), full.begin() + static_cast<long>(n), head.begin()));
      CHECK(std::all_of(full.begin(), full.begin() + static_cast<long>(n), [](float x) { return std::isfinite(x); }));
    }
  }

  TEST_CASE("repeated calls give the same result (scratch is reused, not stale)") {
    // A long context then a short one through the same thread's scratch, and back.
    tandem::test::isa_guard guard;
    std::mt19937 rng(31);
    const shape long_sh{8, 2, 64, 1, 500}, short_sh{8, 2, 64, 1, 3};
    for (const isa path : tandem::test::supported_isas())
      for (kv_type kt : {kv_type::f32, kv_type::f16}) {
        CAPTURE(isa_name(path));
        CAPTURE(int(kt));
        set_isa(path);
        auto a = make_problem(rng, long_sh, kt);
        auto b = make_problem(rng, short_sh, kt);
        const auto a1 = run(a, long_sh, kt, nullptr);
        const auto b1 = run(b, short_sh, kt, nullptr);
        CHECK(run(a, long_sh, kt, nullptr) == a1);
        CHECK(run(b, short_sh, kt, nullptr) == b1);
      }
  }

  TEST_CASE("a single key returns its value row") {
    tandem::test::isa_guard guard;
    const int n_heads = 4, n_kv_heads = 2, head_dim = 8;
    std::mt19937 rng(8);
    for (const isa path : tandem::test::supported_isas())
      for (kv_type kt : {kv_type::f32, kv_type::f16}) {
        CAPTURE(isa_name(path));
        CAPTURE(int(kt));
        set_isa(path);
        test_cache k(kt, 1, n_kv_heads * head_dim), v(kt, 1, n_kv_heads * head_dim);
        k.store(0, random_vector(rng, n_kv_heads * head_dim, 1.0f), 1);
        v.store(0, random_vector(rng, n_kv_heads * head_dim, 1.0f), 1);
        const auto q = random_vector(rng, n_heads * head_dim, 3.0f);
        std::vector<float> out(q.size());
        attention(q.data(), 1, 0, k.data(), v.data(), kt, n_heads, n_kv_heads, head_dim, 0.3f, out.data(), nullptr);
        for (int h = 0; h < n_heads; ++h)
          for (int d = 0; d < head_dim; ++d) CHECK(out[h * head_dim + d] == v.decoded[(h / 2) * head_dim + d]);
      }
  }

  TEST_CASE("f16 cache rounds Q to f16 and accumulates values in f16") {
    // head_dim 8, two keys: k0 = 0, k1 = 8 * e0, v0 = e0, v1 = 0. Key 0 (score 0) is added
    // first with weight 1; key 1 (score 8 q0) raises the running max, so the accumulator is
    // rescaled by exp(-8 q0) and rounded to f16, then divided by the sum 1 + exp(-8 q0).
    // q0 = 1 + 1.9 * 2^-12 rounds to 1.0 in f16, so the expected value uses exp(-8) exactly.
    tandem::test::isa_guard guard;
    for (const isa path : tandem::test::supported_isas()) {
      CAPTURE(isa_name(path));
      set_isa(path);
      const int head_dim = 8;
      std::vector<float> k_rows(16, 0.0f), v_rows(16, 0.0f), q(8, 0.0f);
      k_rows[8] = 8.0f;
      v_rows[0] = 1.0f;
      q[0] = 1.0f + 1.9f / 4096.0f;
      std::vector<uint16_t> kc(16), vc(16);
      kv_store(kc.data(), kv_type::f16, 0, k_rows.data(), 2, head_dim);
      kv_store(vc.data(), kv_type::f16, 0, v_rows.data(), 2, head_dim);
      std::vector<float> out(8);
      attention(q.data(), 1, 1, kc.data(), vc.data(), kv_type::f16, 1, 1, head_dim, 1.0f, out.data(), nullptr);

      const auto expected = [](float gap) {
        const float rescale = std::exp(-gap);
        return round_f16(rescale) * (1.0f / (rescale + 1.0f));
      };
      REQUIRE(expected(8.0f) != expected(8.0f * q[0]));
      CHECK(out[0] == expected(8.0f));
      for (int d = 1; d < head_dim; ++d) CHECK(out[d] == 0.0f);

      // The same data in an f32 cache is not rounded at all.
      std::vector<float> out32(8);
      attention(q.data(), 1, 1, k_rows.data(), v_rows.data(), kv_type::f32, 1, 1, head_dim, 1.0f, out32.data(), nullptr);
      CHECK(out32[0] == doctest::Approx(1.0 / (1.0 + std::exp(8.0 * double(q[0])))).epsilon(1e-6));
    }
  }
}
