// Packed weights: format, packing, row dequantization and the portable product (packed.h).
#include "kernels/cpu/packed.h"

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/blocks.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/panel.h"
#include "kernels/cpu/quants.h"

namespace tandem::kernels::cpu {

size_t packed_near_ahead_avx2_for(weight_type wt, const cpu_identity& cpu) {
  if (wt == weight_type::q4_0 && cpu.amd && cpu.family == 0x19u) return k_packed_q4_0_near_ahead_zen3;
  return k_packed_near_ahead_avx2;
}

const size_t g_packed_q4_0_near_ahead_avx2 = packed_near_ahead_avx2_for(weight_type::q4_0, this_cpu());
const bool g_packed_self_streaming = streams_prefetch_themselves(this_cpu());
const bool g_packed_split_sums8 = packed_avx512_split_sums(8, this_cpu());

namespace {

constexpr int R = k_panel_rows;
static_assert(k_panel_rows == 16, "packed_unit_bytes (packed.h) counts 16-row panels");

void require_packable(weight_type wt) {
  if (!packable(wt)) throw std::invalid_argument("packed weights: no packed form for " + display_name(wt));
}

float half(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return fp16_to_fp32(h);
}

// Byte index, within one chunk's 64-byte group register, of row r, column c of the chunk.
inline int lane_byte(int r, int c) { return 4 * r + c % 4; }

}  // namespace

bool packable(weight_type wt) { return packed_unit_bytes(wt) != 0; }

bool pack_at_load(weight_type wt) { return packable(wt) && active_isa() != isa::scalar; }

size_t packed_panel_bytes(weight_type wt, int64_t cols) {
  require_packable(wt);
  return static_cast<size_t>(cols / packed_unit_cols(wt)) * packed_unit_bytes(wt);
}

size_t packed_bytes(weight_type wt, int64_t rows, int64_t cols) { return static_cast<size_t>((rows + R - 1) / R) * packed_panel_bytes(wt, cols); }

void pack_weights(weight_type wt, const void* src, int64_t rows, int64_t cols, void* dst) {
  require_packable(wt);
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(dst);
  const size_t w_row = static_cast<size_t>(row_bytes(wt, cols));
  const size_t pb = packed_panel_bytes(wt, cols), ub = packed_unit_bytes(wt);
  const int64_t uc = packed_unit_cols(wt);
  std::memset(d, 0, packed_bytes(wt, rows, cols));
  // Codes come from the per-call panel packer (one byte per code, tested against the GGUF
  // decoders); scales straight from the blocks, as raw fp16 where they are fp16.
  const size_t tmp_bytes = panel_bytes(wt, cols);
  std::vector<uint8_t> tmp_raw(tmp_bytes + 64);
  uint8_t* tmp = tmp_raw.data() + (64 - reinterpret_cast<uintptr_t>(tmp_raw.data()) % 64) % 64;
  const int sub = panel_sub_elems(wt);
  const size_t sub_bytes = static_cast<size_t>(sub / 4) * 64 + 128;
  const bool wide = isa_supported(isa::avx512);
  for (int64_t p0 = 0; p0 < rows; p0 += R) {
    const int n = static_cast<int>(std::min<int64_t>(R, rows - p0));
    const uint8_t* rows_at = s + p0 * w_row;
    if (wide)
      pack_panel_avx512(wt, rows_at, w_row, n, cols, tmp);
    else
      pack_panel_ref(wt, rows_at, w_row, n, cols, tmp);
    uint8_t* panel = d + (p0 / R) * pb;
    for (int64_t u = 0; u < cols / uc; ++u) {
      uint8_t* unit = panel + u * ub;
      for (int64_t ch = 0; ch < uc / 32; ++ch) {
        const int64_t col0 = u * uc + ch * 32;
        // The 8 group registers of this chunk in the byte-per-code panel.
        auto group = [&](int k) { return tmp + ((col0 + 4 * k) / sub) * sub_bytes + ((col0 + 4 * k) % sub) / 4 * 64; };
        if (wt == weight_type::q8_0) {
          for (int k = 0; k < 8; ++k) std::memcpy(unit + 64 * k, group(k), 64);
          continue;
        }
        uint8_t* nib = unit + ch * 4 * 64;
        for (int q = 0; q < 4; ++q)
          for (int i = 0; i < 64; ++i) nib[64 * q + i] = static_cast<uint8_t>((group(q)[i] & 0xF) | (group(q + 4)[i] & 0xF) << 4);
        if (packed_has_fifth_bit(wt)) {
          uint8_t* fifth = unit + packed_fifth_at(wt, static_cast<int>(ch));
          for (int k = 0; k < 8; ++k)
            for (int i = 0; i < 64; ++i) fifth[8 * k + i / 8] |= static_cast<uint8_t>(((group(k)[i] >> 4) & 1) << (i % 8));
        }
        if (wt == weight_type::q6_k) {
          uint8_t* hi = unit + 8 * 4 * 64 + ch * 2 * 64;
          for (int h = 0; h < 2; ++h)
            for (int i = 0; i < 64; ++i) {
              uint8_t v = 0;
              for (int j = 0; j < 4; ++j) v = static_cast<uint8_t>(v | ((group(4 * h + j)[i] >> 4) & 3) << (2 * j));
              hi[64 * h + i] = v;
            }
        }
      }
      // Scales of this unit, row by row from the blocks.
      for (int r = 0; r < n; ++r) {
        const uint8_t* row = rows_at + r * w_row;
        switch (wt) {
          case weight_type::q4_0:
          case weight_type::q4_1:
          case weight_type::q5_0:
          case weight_type::q5_1:
          case weight_type::q8_0: {
            // Every legacy block starts with its fp16 d, then (Q4_1, Q5_1) its fp16 m.
            const uint8_t* b = row + u * info(wt).block_bytes;
            std::memcpy(unit + packed_scales_at(wt) + 2 * r, b, 2);
            if (wt == weight_type::q4_1 || wt == weight_type::q5_1) std::memcpy(unit + packed_scales_at(wt) + 2 * R + 2 * r, b + 2, 2);
            break;
          }
          case weight_type::q4_k:
          case weight_type::q5_k: {
            // Q5_K's d, dmin and scales lie where Q4_K's do.
            const size_t block = wt == weight_type::q4_k ? sizeof(block_q4_k) : sizeof(block_q5_k);
            const auto* b = reinterpret_cast<const block_q4_k*>(row + u * block);
            uint8_t* at = unit + packed_scales_at(wt);
            std::memcpy(at + 2 * r, b->d, 2);
            std::memcpy(at + 2 * R + 2 * r, b->dmin, 2);
            for (int j = 0; j < 8; ++j) unpack_k_scale(b->scales, j, at[4 * R + R * j + r], at[4 * R + 8 * R + R * j + r]);
            break;
          }
          case weight_type::q6_k: {
            const auto* b = reinterpret_cast<const block_q6_k*>(row + u * sizeof(block_q6_k));
            uint8_t* at = unit + packed_scales_at(wt);
            std::memcpy(at + 2 * r, b->d, 2);
            for (int j = 0; j < 16; ++j) at[2 * R + R * j + r] = static_cast<uint8_t>(b->scales[j]);
            break;
          }
          default:
            break;
        }
      }
    }
  }
}

namespace {

// Code of row r, column c (0..31) of chunk `ch` of a packed unit.
int packed_code(weight_type wt, const uint8_t* unit, int ch, int r, int c) {
  const int k = c / 4, i = lane_byte(r, c);
  if (wt == weight_type::q8_0) return unit[64 * k + i];
  const uint8_t n = unit[ch * 256 + 64 * (k % 4) + i];
  int code = k < 4 ? n & 0xF : n >> 4;
  if (wt == weight_type::q6_k) code |= ((unit[2048 + ch * 128 + 64 * (k / 4) + i] >> (2 * (k % 4))) & 3) << 4;
  if (packed_has_fifth_bit(wt)) code |= ((unit[packed_fifth_at(wt, ch) + 8 * k + i / 8] >> (i % 8)) & 1) << 4;
  return code;
}

}  // namespace

void dequantize_packed_row(weight_type wt, const void* packed, int64_t cols, int64_t row, float* out) {
  require_packable(wt);
  const uint8_t* panel = static_cast<const uint8_t*>(packed) + (row / R) * packed_panel_bytes(wt, cols);
  const int r = static_cast<int>(row % R);
  const size_t ub = packed_unit_bytes(wt);
  const int64_t uc = packed_unit_cols(wt);
  // The formulas of the GGUF dequantizers (quants.cpp), so the values match.
  for (int64_t u = 0; u < cols / uc; ++u) {
    const uint8_t* unit = panel + u * ub;
    float* y = out + u * uc;
    switch (wt) {
      case weight_type::q4_0:
      case weight_type::q5_0:
      case weight_type::q8_0: {
        const float d = half(unit + packed_scales_at(wt) + 2 * r);
        const int offset = panel_code_offset(wt);
        for (int c = 0; c < 32; ++c) y[c] = static_cast<float>(packed_code(wt, unit, 0, r, c) + offset) * d;
        break;
      }
      case weight_type::q4_1:
      case weight_type::q5_1: {
        const float d = half(unit + packed_scales_at(wt) + 2 * r), m = half(unit + packed_scales_at(wt) + 2 * R + 2 * r);
        for (int c = 0; c < 32; ++c) y[c] = static_cast<float>(packed_code(wt, unit, 0, r, c)) * d + m;
        break;
      }
      case weight_type::q4_k:
      case weight_type::q5_k: {
        const uint8_t* at = unit + packed_scales_at(wt);
        const float d = half(at + 2 * r), dmin = half(at + 2 * R + 2 * r);
        for (int j = 0; j < 8; ++j) {
          const float dj = d * at[4 * R + R * j + r], mj = dmin * at[4 * R + 8 * R + R * j + r];
          for (int c = 0; c < 32; ++c) y[32 * j + c] = dj * static_cast<float>(packed_code(wt, unit, j, r, c)) - mj;
        }
        break;
      }
      case weight_type::q6_k: {
        const uint8_t* at = unit + packed_scales_at(wt);
        const float d = half(at + 2 * r);
        for (int e = 0; e < 256; ++e) {
          const auto sc = static_cast<int8_t>(at[2 * R + R * (e / 16) + r]);
          y[e] = d * static_cast<float>(sc) * static_cast<float>(packed_code(wt, unit, e / 32, r, e % 32) - 32);
        }
        break;
      }
      default:
        break;
    }
  }
}

void packed_dot_ref(weight_type wt, const uint8_t* panel, int64_t cols, const int8_t* codes, const float* aux, int n_act, float* out,
                    int64_t out_stride, int n_w) {
  require_packable(wt);
  const int sub = panel_sub_elems(wt);
  const int64_t nsub = cols / sub;
  const size_t ub = packed_unit_bytes(wt);
  const int64_t uc = packed_unit_cols(wt);
  for (int o = 0; o < n_w; ++o) {
    // Scale and min per sub-block as panel_decode_row defines them.
    for (int r = 0; r < n_act; ++r) {
      float acc = 0.0f;
      for (int64_t s = 0; s < nsub; ++s) {
        const int64_t col0 = s * sub;
        const uint8_t* unit = panel + (col0 / uc) * ub;
        const int ch = static_cast<int>(col0 % uc) / 32;
        float scale = 0, min = 0;
        switch (wt) {
          case weight_type::q4_0:
          case weight_type::q5_0:
          case weight_type::q8_0:
            scale = half(unit + packed_scales_at(wt) + 2 * o);
            min = static_cast<float>(panel_code_offset(wt)) * scale;
            break;
          case weight_type::q4_1:
          case weight_type::q5_1:
            scale = half(unit + packed_scales_at(wt) + 2 * o);
            min = half(unit + packed_scales_at(wt) + 2 * R + 2 * o);
            break;
          case weight_type::q4_k:
          case weight_type::q5_k: {
            const uint8_t* at = unit + packed_scales_at(wt);
            scale = half(at + 2 * o) * at[4 * R + R * ch + o];
            min = -half(at + 2 * R + 2 * o) * at[4 * R + 8 * R + R * ch + o];
            break;
          }
          case weight_type::q6_k: {
            const uint8_t* at = unit + packed_scales_at(wt);
            const int j = static_cast<int>(col0 % 256) / 16;
            scale = half(at + 2 * o) * static_cast<float>(static_cast<int8_t>(at[2 * R + R * j + o]));
            min = -32.0f * scale;
            break;
          }
          default:
            break;
        }
        int32_t dot = 0;
        for (int e = 0; e < sub; ++e) {
          const int c = static_cast<int>(col0 % 32) + e;
          dot += packed_code(wt, unit, ch, o, c) * codes[r * cols + col0 + e];
        }
        const float* x = aux + (r * nsub + s) * k_panel_aux_per_sub;
        acc += scale * x[0] * static_cast<float>(dot) + min * x[1];
      }
      out[r * out_stride + o] = acc;
    }
  }
}

void tile_packed_act_row(weight_type wt, int64_t cols, const int8_t* codes, const float* aux, int r, int n_group, int8_t* tiled_codes,
                         float* tiled_aux) {
  for (int64_t c = 0; c < cols / 32; ++c) std::memcpy(tiled_codes + (c * n_group + r) * 32, codes + c * 32, 32);
  const int64_t nsub = cols / panel_sub_elems(wt);
  for (int64_t s = 0; s < nsub; ++s)
    std::memcpy(tiled_aux + (s * n_group + r) * k_panel_aux_per_sub, aux + s * k_panel_aux_per_sub, k_panel_aux_per_sub * sizeof(float));
}

void tile_packed_acts(weight_type wt, int64_t cols, const int8_t* codes, const float* aux, int n_group, int8_t* tiled_codes, float* tiled_aux) {
  const auto aux_per_row = static_cast<int64_t>(panel_act_aux_floats(wt, cols, 1));
  for (int r = 0; r < n_group; ++r) tile_packed_act_row(wt, cols, codes + r * cols, aux + r * aux_per_row, r, n_group, tiled_codes, tiled_aux);
}

}  // namespace tandem::kernels::cpu
