#include "kernels/cpu/vec_dot.h"

#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cpu/blocks.h"
#include "kernels/cpu/quants.h"

using namespace tandem::kernels;
using namespace tandem::kernels::cpu;

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
  std::vector<int> q;    // k_n codes, unsigned (0..15 / 0..31 / 0..63)
  std::vector<int> sc;   // per block: 8 (Q4_K/Q5_K) or 16 (Q6_K) sub-block scales
  std::vector<int> m;    // per block: 8 mins (Q4_K/Q5_K)
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
  for (int64_t i = 0; i < k_n; ++i)
    r.q.push_back(kind == 3 ? static_cast<int>(rng() % (code_max + 1)) : kind == 2 ? 0 : code_max);
  for (int b = 0; b < k_blocks; ++b) {
    for (int j = 0; j < n_sc; ++j) {
      int sc = 0;
      if (t == weight_type::q6_k)
        sc = kind == 0   ? 127
             : kind == 1 ? -128
             : kind == 2 ? (j % 2 ? 127 : -128)
                         : static_cast<int>(rng() % 256) - 128;
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
      const int v = kind == 0   ? -128
                    : kind == 1 ? 127
                    : kind == 2 ? (i % 2 ? -128 : 127)
                                : static_cast<int>(rng() % 256) - 128;
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

dot_fn avx512_kernel(weight_type t) {
  return t == weight_type::q4_k ? dot_q4_k_avx512 : t == weight_type::q5_k ? dot_q5_k_avx512 : dot_q6_k_avx512;
}

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
      avx512_kernel(t)(k_n, w.data(), w_row, k_max_weight_rows, act.data(), a_row, k_max_act_rows, &tile[0][0],
                       k_max_weight_rows);
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
          find_dot_kernel(t).scalar(k_n, w.data() + w_row * static_cast<size_t>(o), w_row, 1,
                                    act.data() + static_cast<size_t>(r * k_blocks), a_row, 1, &scalar, 1);
          CHECK(std::fabs(scalar - expected) <= tol);
          CHECK(std::fabs(tile[r][o] - expected) <= tol);
        }
    }
  }
}
