// The CUDA element-wise, attention and sampling ops (kernels/cuda/ops.h) against their CPU
// twins and double-precision references on seeded random data: norms, RoPE in every variant,
// SwiGLU, softmax, and a paged KV cache with scrambled block tables for decode and prefill
// rows. Outputs are poisoned as in gpu_matmul_test.cpp. Suite "gpu_ops" runs as CTest's
// kernels_gpu entry, which reports "skipped" (exit 77) where no device answers.
#include <doctest/doctest.h>

#include <cstdlib>

#if defined(TANDEM_HAVE_CUDA)

#include "tests/kernels/gpu_test_util.h"

using namespace tandem::test::gpu;

namespace {

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
    // q8_0 and q4_0: both sides dequantize the same bytes to f32 and stay in f32.
    {cpu::kv_type::q8_0, 1e-4, 1e-4},
    {cpu::kv_type::q4_0, 1e-4, 1e-4},
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
          for (int64_t r = 0; r < n_rows; ++r) cpu::rms_norm(x.data() + r * n, weighted ? wv.data() : nullptr, want.data() + r * n, n, eps);
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
        cu::rope(dx.get(), n_rows, row_stride, c.n_heads, c.head_dim, dpos.get(), p, c.factors ? dff.get() : nullptr, s.get());
        const auto got = dx.read();
        auto want = x;
        for (int64_t r = 0; r < n_rows; ++r) cpu::rope(want.data() + r * row_stride, c.n_heads, c.head_dim, pos[size_t(r)], p_host);
        for (int64_t r = 0; r < n_rows; ++r) {
          CAPTURE(pos[size_t(r)]);
          // Both sides compute angles in float: each within 1e-5 + 1e-6 * pos of exact
          // (ops_test.cpp), so within twice that of each other.
          const double tol = 2e-5 + 2e-6 * pos[size_t(r)];
          double worst = 0;
          size_t others_changed = 0;
          for (int64_t i = 0; i < row_stride; ++i) {
            const size_t k = size_t(r * row_stride + i);
            if (i < used)
              worst = std::max(worst, std::fabs(double(got[k]) - want[k]));
            else
              others_changed += got[k] != x[k];
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
        CAPTURE(std::string(cpu::kv_type_name(kt)));
        const int64_t row = int64_t(sh.n_kv_heads) * sh.head_dim;
        const int64_t bt = sh.block_tokens;
        const int64_t stride = cpu::kv_bytes(kt, (bt + 3) * row);  // bytes, a gap between blocks
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
        const auto slot = [&](int q, int64_t p) {  // byte offset of position p of sequence q
          return int64_t(tables[size_t(table_at[size_t(q)] + p / bt)]) * stride + cpu::kv_bytes(kt, (p % bt) * row);
        };

        // Every sequence's K and V rows for all its positions.
        std::vector<std::vector<float>> kdata, vdata;
        for (int q = 0; q < k_n_seqs; ++q) {
          kdata.push_back(gaussian(size_t(len[size_t(q)] * row), ++seed));
          vdata.push_back(gaussian(size_t(len[size_t(q)] * row), ++seed));
        }

        // The pools start as NaN bytes, as do the host copies the CPU writes into.
        const size_t pool_bytes = size_t(n_pool * stride);
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
        // every row where the block table puts it, rounded to nearest even (f16) or quantized
        // as ggml does (q8_0, q4_0), nothing else touched.
        const auto store = [&](const std::vector<kv_row>& rows) {
          std::vector<float> kr, vr;
          for (const auto& r : rows) {
            kr.insert(kr.end(), kdata[size_t(r.seq)].begin() + r.pos * row, kdata[size_t(r.seq)].begin() + (r.pos + 1) * row);
            vr.insert(vr.end(), vdata[size_t(r.seq)].begin() + r.pos * row, vdata[size_t(r.seq)].begin() + (r.pos + 1) * row);
            const size_t at = size_t(slot(r.seq, r.pos));
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
          for (size_t i = 0; i < pool_bytes; ++i) {
            k_wrong += gk[i] != hk[i];
            v_wrong += gv[i] != hv[i];
          }
          CHECK(k_wrong == 0);
          CHECK(v_wrong == 0);
        };

        // Element e of the row at byte `at`, decoded from the ggml block layouts.
        const auto cache_value = [&](const std::vector<uint8_t>& pool, int64_t at, int64_t e) {
          const uint8_t* p = pool.data() + at;
          uint16_t h;
          switch (kt) {
            case cpu::kv_type::f32: {
              float f;
              std::memcpy(&f, p + e * 4, 4);
              return double(f);
            }
            case cpu::kv_type::f16:
              std::memcpy(&h, p + e * 2, 2);
              return double(cpu::fp16_to_fp32(h));
            case cpu::kv_type::q8_0:
              p += (e / 32) * 34;
              std::memcpy(&h, p, 2);
              return double(cpu::fp16_to_fp32(h)) * double(int8_t(p[2 + e % 32]));
            case cpu::kv_type::q4_0: {
              p += (e / 32) * 18;
              std::memcpy(&h, p, 2);
              const int j = int(e % 32), q = j < 16 ? (p[2 + j] & 15) : (p[2 + j - 16] >> 4);
              return double(cpu::fp16_to_fp32(h)) * double(q - 8);
            }
          }
          return 0.0;
        };

        // Runs attention for the rows (queries q, in the rows' order) and checks it against
        // exact attention over the host cache and against the CPU twin (out_cpu, same order).
        const auto attend = [&](const std::vector<kv_row>& rows, const std::vector<float>& q, const std::vector<float>& out_cpu) {
          const batch b = make_batch(rows);
          cu::row_map m = b.map();
          m.tables = dtables.get();
          dev_array<float> dq(q, s);
          dev_array<float> dout(q.size(), s);
          cu::attention(dq.get(), dout.get(), int64_t(rows.size()), m, layer, sh.n_heads, sh.n_kv_heads, sh.head_dim, scale, s.get());
          const auto got = dout.read();
          const int group = sh.n_heads / sh.n_kv_heads;
          double worst_exact = 0, worst_cpu = 0;
          for (size_t r = 0; r < rows.size(); ++r)
            for (int h = 0; h < sh.n_heads; ++h) {
              const float* qh = q.data() + int64_t(r) * q_row + h * sh.head_dim;
              const int64_t kv_off = int64_t(h / group) * sh.head_dim;  // elements into the row
              const int64_t n_keys = rows[r].pos + 1;
              std::vector<double> sc(static_cast<size_t>(n_keys));
              double mx = -1e300;
              for (int64_t t = 0; t < n_keys; ++t) {
                double dot = 0;
                const int64_t at = slot(rows[r].seq, t);
                for (int d = 0; d < sh.head_dim; ++d) dot += double(qh[d]) * cache_value(hk, at, kv_off + d);
                sc[size_t(t)] = dot * scale;
                mx = std::max(mx, sc[size_t(t)]);
              }
              double sum = 0;
              for (auto& v : sc) sum += v = std::exp(v - mx);
              for (int d = 0; d < sh.head_dim; ++d) {
                double o = 0;
                for (int64_t t = 0; t < n_keys; ++t) o += sc[size_t(t)] * cache_value(hv, slot(rows[r].seq, t), kv_off + d);
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
            cpu::attention_run run{q.data() + int64_t(r) * q_row, int64_t(e - r), rows[r].pos, hk.data(), hv.data(), out.data() + int64_t(r) * q_row};
            run.pages = {tables.data() + table_at[size_t(rows[r].seq)], bt, stride};
            runs.push_back(run);
            r = e;
          }
          cpu::attention_many(runs.data(), int64_t(runs.size()), kt, sh.n_heads, sh.n_kv_heads, sh.head_dim, scale, nullptr);
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

  TEST_CASE("hadamard_heads matches the CPU bit for bit, heads of a strided row in place") {
    if (!device_or_skip()) return;
    cu::stream s;
    uint32_t seed = 4100;
    struct had_shape {
      int64_t n_rows, row_stride;
      int n_heads, head_dim;
    };
    for (const had_shape sh : {had_shape{1, 64, 1, 64}, had_shape{5, 8 * 64 + 7, 8, 64}, had_shape{3, 4 * 128, 4, 128},
                               had_shape{7, 2 * 32 + 1, 2, 32}, had_shape{2, 256, 1, 256}}) {
      CAPTURE(sh.n_heads);
      CAPTURE(sh.head_dim);
      auto want = gaussian(size_t(sh.n_rows * sh.row_stride), ++seed);
      dev_array<float> x(want, s);
      cpu::hadamard_heads(want.data(), sh.n_rows, sh.row_stride, sh.n_heads, sh.head_dim);
      cu::hadamard_heads(x.get(), sh.n_rows, sh.row_stride, sh.n_heads, sh.head_dim, s.get());
      const auto got = x.read();
      size_t wrong = 0;
      for (size_t i = 0; i < want.size(); ++i) wrong += std::memcmp(&got[i], &want[i], 4) != 0;
      CHECK(wrong == 0);  // the gaps between rows' heads untouched, the heads the same bits
    }
    dev_array<float> x(size_t(64), s);
    CHECK_THROWS_WITH_AS(cu::hadamard_heads(x.get(), 1, 48, 1, 48, s.get()), doctest::Contains("power of two"), std::invalid_argument);
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
      std::fill(x.begin() + 2 * n, x.begin() + 3 * n, 1.5f);  // all equal: 0
      std::fill(x.begin() + 3 * n, x.begin() + 4 * n, -inf);  // masked but the last
      x[size_t(4 * n - 1)] = -1e30f;
      std::fill(x.begin() + 4 * n, x.begin() + 5 * n, -inf);  // all masked: 0
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
}

#else  // !TANDEM_HAVE_CUDA

TEST_SUITE("gpu_ops") {
  TEST_CASE("CUDA ops") {
    MESSAGE("skipped: built without CUDA");
    if (std::getenv("TANDEM_GPU_ENTRY")) std::exit(77);
  }
}

#endif
