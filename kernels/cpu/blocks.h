// Byte layouts of the quantized blocks (ggml-common.h), shared by the CPU quantizers and dots.
//
// Half-precision fields are stored as byte pairs, so every weight block has alignment 1: a
// block may sit at any address of an mmap'd GGUF file or a test buffer without a misaligned
// load. They are read and written only through load_half / store_half (memcpy).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

namespace tandem::kernels::cpu {

inline constexpr int k_qk_legacy = 32;      // elements per Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q8_1 block
inline constexpr int k_qk_k = 256;          // elements per K-quant super-block
inline constexpr int k_k_scale_bytes = 12;  // packed 6-bit scales + mins of Q4_K / Q5_K

using half_bytes = uint8_t[2];

static inline uint16_t load_half(const half_bytes& h) {
  uint16_t v;
  std::memcpy(&v, h, sizeof v);
  return v;
}
static inline void store_half(half_bytes& h, uint16_t v) { std::memcpy(h, &v, sizeof v); }

struct block_q4_0 {
  half_bytes d;    // scale
  uint8_t qs[16];  // element j in low nibble of qs[j], element j+16 in the high nibble
};
struct block_q4_1 {
  half_bytes d;    // scale
  half_bytes m;    // offset (value of quant 0)
  uint8_t qs[16];  // as Q4_0
};
struct block_q5_0 {
  half_bytes d;
  uint8_t qh[4];   // bit j = 5th bit of element j (little-endian uint32)
  uint8_t qs[16];  // low 4 bits, as Q4_0
};
struct block_q5_1 {
  half_bytes d;
  half_bytes m;
  uint8_t qh[4];
  uint8_t qs[16];
};
struct block_q8_0 {
  half_bytes d;
  int8_t qs[32];
};
// Activation block for Q4_1 / Q5_1 weights: s = d * sum(qs) carries the offset term.
struct block_q8_1 {
  half_bytes d;
  half_bytes s;
  int8_t qs[32];
};
struct block_q4_k {
  half_bytes d;                     // super-block scale of the 6-bit sub-block scales
  half_bytes dmin;                  // super-block scale of the 6-bit sub-block mins
  uint8_t scales[k_k_scale_bytes];  // 8 scales + 8 mins, 6 bits each (see unpack_k_scales)
  uint8_t qs[128];                  // 64-element chunk c: qs[32c+l] = elem 64c+l | elem 64c+32+l << 4
};
struct block_q5_k {
  half_bytes d;
  half_bytes dmin;
  uint8_t scales[k_k_scale_bytes];
  uint8_t qh[32];   // bit 2c of qh[l]: 5th bit of elem 64c+l; bit 2c+1: of 64c+32+l
  uint8_t qs[128];  // low 4 bits, as Q4_K
};
struct block_q6_k {
  uint8_t ql[128];    // low 4 bits (see quants.cpp for the order)
  uint8_t qh[64];     // high 2 bits
  int8_t scales[16];  // one signed 8-bit scale per 16 elements
  half_bytes d;       // super-block scale
};
// Activation block for K-quant weights; only ever in buffers tandem allocates (aligned).
struct block_q8_k {
  float d;
  int8_t qs[256];
  int16_t bsums[16];  // sum of qs over each group of 16
};

static_assert(sizeof(block_q4_0) == 18 && alignof(block_q4_0) == 1);
static_assert(sizeof(block_q4_1) == 20 && alignof(block_q4_1) == 1);
static_assert(sizeof(block_q5_0) == 22 && alignof(block_q5_0) == 1);
static_assert(sizeof(block_q5_1) == 24 && alignof(block_q5_1) == 1);
static_assert(sizeof(block_q8_0) == 34 && alignof(block_q8_0) == 1);
static_assert(sizeof(block_q8_1) == 36 && alignof(block_q8_1) == 1);
static_assert(sizeof(block_q4_k) == 144 && alignof(block_q4_k) == 1);
static_assert(sizeof(block_q5_k) == 176 && alignof(block_q5_k) == 1);
static_assert(sizeof(block_q6_k) == 210 && alignof(block_q6_k) == 1);
static_assert(sizeof(block_q8_k) == 292);

// The four signed 6-bit codes of a Q6_K half-block at lane l (0..31): elements l, l+32, l+64
// and l+96 of the half whose ql/qh start at the given pointers (ql += 64, qh += 32 per half).
static inline void unpack_q6_k_codes(const uint8_t* ql, const uint8_t* qh, int l, int q[4]) {
  q[0] = ((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
  q[1] = ((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
  q[2] = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
  q[3] = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
}

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K / Q5_K block.
static inline void unpack_k_scale(const uint8_t* scales, int j, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = scales[j] & 63;
    m = scales[j + 4] & 63;
  } else {
    sc = static_cast<uint8_t>((scales[j + 4] & 0xF) | ((scales[j - 4] >> 6) << 4));
    m = static_cast<uint8_t>((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

// All eight scales and mins at once (used by the dots, once per super-block).
static inline void unpack_k_scales(const uint8_t* scales, uint8_t sc[8], uint8_t m[8]) {
  for (int j = 0; j < 8; ++j) unpack_k_scale(scales, j, sc[j], m[j]);
}

}  // namespace tandem::kernels::cpu
