// Attention over q8_0 and q4_0 caches (kernels/cpu/attention_quant.cpp) and the per-head
// rotation that keeps 4-bit caches usable.
#include <doctest/doctest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_pool.h"
#include "tests/kernels/attention_test_util.h"

using namespace tandem::kernels::cpu;
using namespace tandem::test::attention_util;

TEST_SUITE("attention") {
  TEST_CASE("a q8_0 or q4_0 cache: exact attention over its dequantized rows, the same bits paged, chunked or threaded") {
    std::mt19937 rng(4343);
    thread_pool pool(2);
    for (const kv_type kt : {kv_type::q8_0, kv_type::q4_0}) {
      for (const shape sh :
           {shape{4, 4, 32, 1, 0}, shape{8, 2, 64, 1, 70}, shape{9, 3, 64, 33, 5}, shape{8, 1, 128, 20, 40}, shape{16, 4, 64, 1, 50}}) {
        CAPTURE(std::string(kv_type_name(kt)));
        CAPTURE(sh.n_heads);
        CAPTURE(sh.head_dim);
        CAPTURE(sh.n_q);
        problem p = make_problem(rng, sh, kt);
        const auto ref = reference_attention(p.q, sh.n_q, sh.pos0, p.k, p.v, sh.n_heads, sh.n_kv_heads, sh.head_dim, p.scale, false);
        const auto want = run(p, sh, kt, nullptr);
        double worst = 0;
        for (size_t i = 0; i < ref.size(); ++i) worst = std::max(worst, std::abs(double(want[i]) - ref[i]));
        CHECK(worst < 2e-5);
        CHECK(run(p, sh, kt, &pool) == want);

        // Paged: the rows in scrambled blocks with a gap of 6 bytes between them (a stride that is
        // no whole number of blocks of 32), 16 positions a block.
        const int64_t bt = 16, row = kv_bytes(kt, int64_t(sh.n_kv_heads) * sh.head_dim);
        const int64_t n_keys = sh.pos0 + sh.n_q, n_blocks = (n_keys + bt - 1) / bt, stride = bt * row + 6;
        std::vector<int32_t> table(static_cast<size_t>(n_blocks));
        for (int64_t b = 0; b < n_blocks; ++b) table[size_t(b)] = int32_t((b * 5 + 3) % (n_blocks + 4));
        std::vector<unsigned char> kpool(size_t((n_blocks + 4) * stride), 0xFF), vpool(kpool.size(), 0xFF);
        for (int64_t pos = 0; pos < n_keys; ++pos) {
          const size_t at = size_t(table[size_t(pos / bt)] * stride + (pos % bt) * row);
          std::memcpy(kpool.data() + at, reinterpret_cast<unsigned char*>(p.k.data()) + pos * row, size_t(row));
          std::memcpy(vpool.data() + at, reinterpret_cast<unsigned char*>(p.v.data()) + pos * row, size_t(row));
        }
        std::vector<float> paged(p.q.size(), -1.0f);
        attention_run r{p.q.data(), sh.n_q, sh.pos0, kpool.data(), vpool.data(), paged.data(), {table.data(), bt, stride}};
        attention_many(&r, 1, kt, sh.n_heads, sh.n_kv_heads, sh.head_dim, p.scale, &pool);
        CHECK(paged == want);

        // The same rows in chunks of 3 (each chunk its own call, as a chunked prefill runs them).
        std::vector<float> chunked(p.q.size(), -1.0f);
        const int64_t qrow = int64_t(sh.n_heads) * sh.head_dim;
        for (int64_t r0 = 0; r0 < sh.n_q; r0 += 3) {
          const int64_t n = std::min<int64_t>(3, sh.n_q - r0);
          attention(p.q.data() + r0 * qrow, n, sh.pos0 + r0, p.k.data(), p.v.data(), kt, sh.n_heads, sh.n_kv_heads, sh.head_dim, p.scale,
                    chunked.data() + r0 * qrow, nullptr);
        }
        CHECK(chunked == want);
      }
    }
    // Heads that are no whole number of blocks: a clear error, nothing written.
    std::vector<float> q(48, 0.5f), out(48, -1.0f), kv(48);
    CHECK_THROWS_WITH_AS(attention(q.data(), 1, 0, kv.data(), kv.data(), kv_type::q8_0, 1, 1, 48, 1.0f, out.data(), nullptr),
                         doctest::Contains("multiple of 32"), std::invalid_argument);
    CHECK(out[0] == -1.0f);
  }

  TEST_CASE("rotating heads before a q4_0 cache cuts the error that an outlier channel causes") {
    // Keys and values with a few channels 20x the others, as real models' K has: unrotated,
    // each 32-value block's scale follows its outlier and the other values get few of the 16
    // codes; rotated (K, V and Q by hadamard_heads, the output rotated back) the energy is
    // spread over the head first. Both are compared with exact attention over the f32 rows.
    std::mt19937 rng(808);
    const int n_heads = 4, n_kv_heads = 2, head_dim = 64;
    const int64_t n_keys = 160, row = int64_t(n_kv_heads) * head_dim, qrow = int64_t(n_heads) * head_dim;
    const float scale = 1.0f / std::sqrt(float(head_dim));
    auto k = random_vector(rng, size_t(n_keys * row), 1.0f), v = random_vector(rng, size_t(n_keys * row), 1.0f);
    for (int64_t t = 0; t < n_keys; ++t)
      for (int h = 0; h < n_kv_heads; ++h)
        for (const int c : {3, 40}) {
          k[size_t(t * row + h * head_dim + c)] *= 20.0f;
          v[size_t(t * row + h * head_dim + c)] *= 20.0f;
        }
    const auto q = random_vector(rng, size_t(qrow), 0.3f);
    test_cache kf(kv_type::f32, n_keys, row), vf(kv_type::f32, n_keys, row);
    kf.store(0, k, n_keys);
    vf.store(0, v, n_keys);
    const auto exact = reference_attention(q, 1, n_keys - 1, kf, vf, n_heads, n_kv_heads, head_dim, scale, false);
    const auto rms_error = [&](bool rotate) {
      auto kr = k, vr = v, qr = q;
      if (rotate) {
        hadamard_heads(kr.data(), n_keys, row, n_kv_heads, head_dim);
        hadamard_heads(vr.data(), n_keys, row, n_kv_heads, head_dim);
        hadamard_heads(qr.data(), 1, qrow, n_heads, head_dim);
      }
      test_cache kc(kv_type::q4_0, n_keys, row), vc(kv_type::q4_0, n_keys, row);
      kc.store(0, kr, n_keys);
      vc.store(0, vr, n_keys);
      std::vector<float> out(size_t(qrow), -1.0f);
      attention(qr.data(), 1, n_keys - 1, kc.data(), vc.data(), kv_type::q4_0, n_heads, n_kv_heads, head_dim, scale, out.data(), nullptr);
      if (rotate) hadamard_heads(out.data(), 1, qrow, n_heads, head_dim);
      double sum = 0;  // root mean square over the outputs
      for (size_t i = 0; i < out.size(); ++i) sum += (double(out[i]) - exact[i]) * (double(out[i]) - exact[i]);
      return std::sqrt(sum / double(out.size()));
    };
    const double plain = rms_error(false), rotated = rms_error(true);
    CAPTURE(plain);
    CAPTURE(rotated);
    CHECK(rotated < 0.7 * plain);  // measured: 0.052 against 0.097
  }
}
