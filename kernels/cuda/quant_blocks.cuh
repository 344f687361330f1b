// Device-side decoders of the GGUF weight blocks the CUDA kernels take, giving the same values
// as the CPU reference dequantizers (kernels/cpu/quants.cpp).
//
// Each block is decoded cooperatively by `lanes` threads; thread `part` of a block produces
// `n` values whose in-block indices are elem(part, j). Parts are chosen so that neighbouring
// threads read neighbouring bytes (coalesced) and each part needs few scale bytes.
//
// GGUF rows sit at any even address (every supported block and element size is even), so
// fields are read with byte and 16-bit loads only; hosts check the base is 2-byte aligned.
#pragma once

#include <cuda_fp16.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cpu/blocks.h"
#include "kernels/weight_type.h"

namespace tandem::kernels::cuda::detail {

// The CPU structs are the layout's single source of truth; the offsets below must follow them.
namespace cpu_layout = tandem::kernels::cpu;
static_assert(sizeof(cpu_layout::block_q8_0) == 34 && offsetof(cpu_layout::block_q8_0, qs) == 2, "Q8_0 layout");
static_assert(sizeof(cpu_layout::block_q4_0) == 18 && offsetof(cpu_layout::block_q4_0, qs) == 2, "Q4_0 layout");
static_assert(sizeof(cpu_layout::block_q4_k) == 144 && offsetof(cpu_layout::block_q4_k, dmin) == 2 && offsetof(cpu_layout::block_q4_k, scales) == 4 &&
                  offsetof(cpu_layout::block_q4_k, qs) == 16,
              "Q4_K layout");
static_assert(sizeof(cpu_layout::block_q5_k) == 176 && offsetof(cpu_layout::block_q5_k, scales) == 4 && offsetof(cpu_layout::block_q5_k, qh) == 16 &&
                  offsetof(cpu_layout::block_q5_k, qs) == 48,
              "Q5_K layout");
static_assert(sizeof(cpu_layout::block_q6_k) == 210 && offsetof(cpu_layout::block_q6_k, qh) == 128 &&
                  offsetof(cpu_layout::block_q6_k, scales) == 192 && offsetof(cpu_layout::block_q6_k, d) == 208,
              "Q6_K layout");

__device__ __forceinline__ uint32_t ld8(const uint8_t* p) { return __ldg(p); }
// p must be even: see the alignment note at the top.
__device__ __forceinline__ uint32_t ld16(const uint8_t* p) { return __ldg(reinterpret_cast<const unsigned short*>(p)); }
__device__ __forceinline__ uint32_t ld_u32(const uint8_t* p) { return ld16(p) | (ld16(p + 2) << 16); }
__device__ __forceinline__ float ld_f16(const uint8_t* p) { return __half2float(__ushort_as_half(static_cast<unsigned short>(ld16(p)))); }

// Sub-block j (0..7) 6-bit scale and min of a Q4_K / Q5_K block (12 packed bytes at s):
// j < 4 keep the low 6 bits of bytes j and j+4; j >= 4 borrow the top 2 bits of those bytes.
__device__ __forceinline__ void k_scale_min(const uint8_t* s, int j, float& sc, float& m) {
  if (j < 4) {
    sc = static_cast<float>(ld8(s + j) & 63);
    m = static_cast<float>(ld8(s + j + 4) & 63);
  } else {
    const uint32_t b = ld8(s + j + 4);
    sc = static_cast<float>((b & 0xF) | ((ld8(s + j - 4) >> 6) << 4));
    m = static_cast<float>((b >> 4) | ((ld8(s + j) >> 6) << 4));
  }
}

// Plain element types: one element is one "block", one thread per element, so consecutive
// threads read consecutive elements.
struct blk_f32 {
  static constexpr int qk = 1, bytes = 4, lanes = 1, n = 1;
  __device__ static void decode(const uint8_t* b, int, float (&v)[n]) {
    v[0] = __uint_as_float(ld16(b) | (ld16(b + 2) << 16));  // 2-byte alignment only
  }
  __device__ static int elem(int, int) { return 0; }
};
struct blk_f16 {
  static constexpr int qk = 1, bytes = 2, lanes = 1, n = 1;
  __device__ static void decode(const uint8_t* b, int, float (&v)[n]) { v[0] = ld_f16(b); }
  __device__ static int elem(int, int) { return 0; }
};
struct blk_bf16 {
  static constexpr int qk = 1, bytes = 2, lanes = 1, n = 1;
  __device__ static void decode(const uint8_t* b, int, float (&v)[n]) { v[0] = __uint_as_float(ld16(b) << 16); }
  __device__ static int elem(int, int) { return 0; }
};

// Q8_0: part p holds elements 16p .. 16p+15 (qs bytes in element order).
struct blk_q8_0 {
  static constexpr int qk = 32, bytes = 34, lanes = 2, n = 16;
  __device__ static void decode(const uint8_t* b, int p, float (&v)[n]) {
    const float d = ld_f16(b);
    const uint8_t* q = b + 2 + 16 * p;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      const uint32_t u = ld16(q + 2 * k);
      v[2 * k] = static_cast<float>(static_cast<int8_t>(u & 0xFF)) * d;
      v[2 * k + 1] = static_cast<float>(static_cast<int8_t>(u >> 8)) * d;
    }
  }
  __device__ static int elem(int p, int j) { return 16 * p + j; }
};

// Q4_0: part p takes qs bytes 8p .. 8p+7; low nibbles are elements 8p+i (v[i]), high nibbles
// elements 16+8p+i (v[8+i]).
struct blk_q4_0 {
  static constexpr int qk = 32, bytes = 18, lanes = 2, n = 16;
  __device__ static void decode(const uint8_t* b, int p, float (&v)[n]) {
    const float d = ld_f16(b);
    const uint8_t* q = b + 2 + 8 * p;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t u = ld16(q + 2 * k);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int byte = static_cast<int>((u >> (8 * h)) & 0xFF);
        v[2 * k + h] = static_cast<float>((byte & 0xF) - 8) * d;
        v[8 + 2 * k + h] = static_cast<float>((byte >> 4) - 8) * d;
      }
    }
  }
  __device__ static int elem(int p, int j) { return 8 * p + (j & 7) + ((j >> 3) << 4); }
};

// The other 32-element blocks: f16 d, then an f16 offset m (HasM: Q4_1, Q5_1), then 4 bytes
// qh whose bit e is the 5th bit of element e (HasQh: Q5_0, Q5_1), then 16 bytes of nibbles
// as Q4_0. Field offsets, codes and parts follow from these two flags.
template <bool HasM, bool HasQh>
struct legacy_layout {
  static constexpr int m_at = 2, qh_at = HasM ? 4 : 2, qs_at = qh_at + (HasQh ? 4 : 0);
  static constexpr int bytes = qs_at + 16;
};

// Part p (of 2) takes qs bytes 8p .. 8p+7, as blk_q4_0: v[i] is element 8p+i, v[8+i] element
// 16+8p+i. Q4_1 / Q5_1: x = d * q + m, unfused as the CPU's dequantizer (built without FMA)
// rounds it, so the values are its bits. Q5_0: x = d * (q - 16).
template <bool HasM, bool HasQh>
struct blk_legacy {
  using L = legacy_layout<HasM, HasQh>;
  static constexpr int qk = 32, bytes = L::bytes, lanes = 2, n = 16;
  __device__ static void decode(const uint8_t* b, int p, float (&v)[n]) {
    const float d = ld_f16(b);
    const float m = HasM ? ld_f16(b + L::m_at) : 0.0f;
    const uint32_t qh = HasQh ? ld_u32(b + L::qh_at) : 0;
    const uint32_t hl = qh >> (8 * p), hh = qh >> (16 + 8 * p);
    const uint8_t* q = b + L::qs_at + 8 * p;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t u = ld16(q + 2 * k);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int i = 2 * k + h;
        const uint32_t byte = (u >> (8 * h)) & 0xFF;
        const int lo = static_cast<int>((byte & 0xF) | (((hl >> i) & 1) << 4));
        const int hi = static_cast<int>((byte >> 4) | (((hh >> i) & 1) << 4));
        if constexpr (HasM) {
          v[i] = __fadd_rn(__fmul_rn(static_cast<float>(lo), d), m);
          v[8 + i] = __fadd_rn(__fmul_rn(static_cast<float>(hi), d), m);
        } else {
          constexpr int bias = HasQh ? 16 : 8;
          v[i] = static_cast<float>(lo - bias) * d;
          v[8 + i] = static_cast<float>(hi - bias) * d;
        }
      }
    }
  }
  __device__ static int elem(int p, int j) { return blk_q4_0::elem(p, j); }
};
using blk_q4_1 = blk_legacy<true, false>;
using blk_q5_0 = blk_legacy<false, true>;
using blk_q5_1 = blk_legacy<true, true>;
static_assert(blk_q4_1::bytes == sizeof(cpu_layout::block_q4_1) && legacy_layout<true, false>::m_at == offsetof(cpu_layout::block_q4_1, m) &&
                  legacy_layout<true, false>::qs_at == offsetof(cpu_layout::block_q4_1, qs),
              "Q4_1 layout");
static_assert(blk_q5_0::bytes == sizeof(cpu_layout::block_q5_0) && legacy_layout<false, true>::qh_at == offsetof(cpu_layout::block_q5_0, qh) &&
                  legacy_layout<false, true>::qs_at == offsetof(cpu_layout::block_q5_0, qs),
              "Q5_0 layout");
static_assert(blk_q5_1::bytes == sizeof(cpu_layout::block_q5_1) && legacy_layout<true, true>::m_at == offsetof(cpu_layout::block_q5_1, m) &&
                  legacy_layout<true, true>::qh_at == offsetof(cpu_layout::block_q5_1, qh) &&
                  legacy_layout<true, true>::qs_at == offsetof(cpu_layout::block_q5_1, qs),
              "Q5_1 layout");

// Q4_K / Q5_K: part t (0..15) is chunk c = t/4 (64 elements), lanes l0 .. l0+7 with
// l0 = 8*(t%4): v[i] is element 64c+l0+i (sub-block 2c), v[8+i] element 64c+32+l0+i
// (sub-block 2c+1).
__device__ __forceinline__ int k_elem(int t, int j) { return 64 * (t >> 2) + 8 * (t & 3) + (j & 7) + ((j >> 3) << 5); }

// Q4_K / Q5_K: scale and offset of chunk c's two sub-blocks (2c, 2c+1), from the super-block's
// d, dmin and 6-bit packed scales/mins; element = scale * q - offset.
__device__ __forceinline__ void k_chunk_scales(const uint8_t* b, int c, float& d0, float& o0, float& d1, float& o1) {
  const float d = ld_f16(b), dmin = ld_f16(b + 2);
  float sc0, m0, sc1, m1;
  k_scale_min(b + 4, 2 * c, sc0, m0);
  k_scale_min(b + 4, 2 * c + 1, sc1, m1);
  d0 = d * sc0;
  o0 = dmin * m0;
  d1 = d * sc1;
  o1 = dmin * m1;
}

struct blk_q4_k {
  static constexpr int qk = 256, bytes = 144, lanes = 16, n = 16;
  __device__ static void decode(const uint8_t* b, int t, float (&v)[n]) {
    const int c = t >> 2, l0 = 8 * (t & 3);
    float d0, o0, d1, o1;
    k_chunk_scales(b, c, d0, o0, d1, o1);
    const uint8_t* q = b + 16 + 32 * c + l0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t u = ld16(q + 2 * k);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t byte = (u >> (8 * h)) & 0xFF;
        v[2 * k + h] = d0 * static_cast<float>(byte & 0xF) - o0;
        v[8 + 2 * k + h] = d1 * static_cast<float>(byte >> 4) - o1;
      }
    }
  }
  __device__ static int elem(int t, int j) { return k_elem(t, j); }
};

// Q5_K: as Q4_K, plus the 5th bit: bit 2c of qh[l] for the low nibble, bit 2c+1 for the high.
struct blk_q5_k {
  static constexpr int qk = 256, bytes = 176, lanes = 16, n = 16;
  __device__ static void decode(const uint8_t* b, int t, float (&v)[n]) {
    const int c = t >> 2, l0 = 8 * (t & 3);
    float d0, o0, d1, o1;
    k_chunk_scales(b, c, d0, o0, d1, o1);
    const uint8_t* qh = b + 16 + l0;
    const uint8_t* q = b + 48 + 32 * c + l0;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t u = ld16(q + 2 * k), uh = ld16(qh + 2 * k);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t byte = (u >> (8 * h)) & 0xFF, hb = (uh >> (8 * h)) & 0xFF;
        const uint32_t lo = (byte & 0xF) | (((hb >> (2 * c)) & 1) << 4);
        const uint32_t hi = (byte >> 4) | (((hb >> (2 * c + 1)) & 1) << 4);
        v[2 * k + h] = d0 * static_cast<float>(lo) - o0;
        v[8 + 2 * k + h] = d1 * static_cast<float>(hi) - o1;
      }
    }
  }
  __device__ static int elem(int t, int j) { return k_elem(t, j); }
};

// Q6_K: part t (0..15) is half h = t/8 (128 elements), lanes l = l0 .. l0+3 with
// l0 = 4*(t%8); v[4k+i] is element 128h + 32k + l0+i, code k of lane l (unpack_q6_k_codes),
// scaled by scales[8h + l/16 + 2k] (l/16 is the same for the four lanes).
struct blk_q6_k {
  static constexpr int qk = 256, bytes = 210, lanes = 16, n = 16;
  __device__ static void decode(const uint8_t* b, int t, float (&v)[n]) {
    const int h = t >> 3, l0 = 4 * (t & 7);
    const float d = ld_f16(b + 208);
    const uint8_t* ql = b + 64 * h + l0;
    const uint8_t* qh = b + 128 + 32 * h + l0;
    const uint8_t* sc = b + 192 + 8 * h + (l0 >> 4);
    float ds[4];
#pragma unroll
    for (int k = 0; k < 4; ++k) ds[k] = d * static_cast<float>(static_cast<int8_t>(ld8(sc + 2 * k)));
#pragma unroll
    for (int p = 0; p < 2; ++p) {
      const uint32_t a = ld16(ql + 2 * p), a2 = ld16(ql + 32 + 2 * p), hh = ld16(qh + 2 * p);
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int i = 2 * p + e;
        const uint32_t lo = (a >> (8 * e)) & 0xFF, lo2 = (a2 >> (8 * e)) & 0xFF, hi = (hh >> (8 * e)) & 0xFF;
        const int q0 = static_cast<int>((lo & 0xF) | ((hi & 3) << 4)) - 32;
        const int q1 = static_cast<int>((lo2 & 0xF) | (((hi >> 2) & 3) << 4)) - 32;
        const int q2 = static_cast<int>((lo >> 4) | (((hi >> 4) & 3) << 4)) - 32;
        const int q3 = static_cast<int>((lo2 >> 4) | (((hi >> 6) & 3) << 4)) - 32;
        v[i] = ds[0] * static_cast<float>(q0);
        v[4 + i] = ds[1] * static_cast<float>(q1);
        v[8 + i] = ds[2] * static_cast<float>(q2);
        v[12 + i] = ds[3] * static_cast<float>(q3);
      }
    }
  }
  __device__ static int elem(int t, int j) { return 128 * (t >> 3) + 32 * (j >> 2) + 4 * (t & 7) + (j & 3); }
};

// Calls f(blk_xxx{}) for the decoder of wt. Callers have already passed kernels::require, so
// the default branch only guards against the table and this switch drifting apart.
template <class F>
void visit_block(weight_type wt, F&& f) {
  switch (wt) {
    case weight_type::f32:
      f(blk_f32{});
      return;
    case weight_type::f16:
      f(blk_f16{});
      return;
    case weight_type::bf16:
      f(blk_bf16{});
      return;
    case weight_type::q8_0:
      f(blk_q8_0{});
      return;
    case weight_type::q4_0:
      f(blk_q4_0{});
      return;
    case weight_type::q4_1:
      f(blk_q4_1{});
      return;
    case weight_type::q5_0:
      f(blk_q5_0{});
      return;
    case weight_type::q5_1:
      f(blk_q5_1{});
      return;
    case weight_type::q4_k:
      f(blk_q4_k{});
      return;
    case weight_type::q5_k:
      f(blk_q5_k{});
      return;
    case weight_type::q6_k:
      f(blk_q6_k{});
      return;
    default:
      break;
  }
  throw std::invalid_argument("cuda: no block decoder for " + display_name(wt));
}

// Elements per block of a type visit_block takes.
inline int64_t block_elems(weight_type wt) {
  int64_t qk = 0;
  visit_block(wt, [&](auto b) { qk = decltype(b)::qk; });
  return qk;
}

// Host-side argument checks shared by the entry points, throwing std::invalid_argument.
inline void check_blocks(const char* what, weight_type wt, const char* dim, int64_t n) {
  const int64_t qk = block_elems(wt);
  if (n < 0 || n % qk != 0)
    throw std::invalid_argument(std::string("cuda ") + what + ": " + dim + " " + std::to_string(n) + " is not a multiple of " + display_name(wt) +
                                "'s block size " + std::to_string(qk));
}
inline void check_aligned(const char* what, const void* p) {
  if (reinterpret_cast<uintptr_t>(p) % 2 != 0) throw std::invalid_argument(std::string("cuda ") + what + ": weights at an odd address");
}

}  // namespace tandem::kernels::cuda::detail
