// Panel format, activation side data and the portable reference forms (see panel.h).
#include "kernels/cpu/panel.h"

#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "kernels/cpu/act_quant.h"
#include "kernels/cpu/blocks.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/packed.h"
#include "kernels/cpu/quants.h"

namespace tandem::kernels::cpu {
namespace {

float half(const half_bytes& h) { return fp16_to_fp32(load_half(h)); }

// Low nibbles are elements 0..15 of a 32-element block, high nibbles 16..31.
void nibbles(const uint8_t* qs, uint8_t* codes) {
  for (int j = 0; j < 16; ++j) {
    codes[j] = qs[j] & 0xF;
    codes[j + 16] = qs[j] >> 4;
  }
}

void fifth_bits(const uint8_t qh[4], uint8_t* codes) {
  uint32_t bits;
  std::memcpy(&bits, qh, 4);
  for (int j = 0; j < 32; ++j) codes[j] |= static_cast<uint8_t>(((bits >> j) & 1) << 4);
}

size_t sub_block_bytes(int sub) { return static_cast<size_t>(sub / 4) * 64 + 2 * k_panel_rows * sizeof(float); }

}  // namespace

bool panel_supported(weight_type wt) { return panel_sub_elems(wt) != 0; }

int panel_sub_elems(weight_type wt) {
  switch (wt) {
    case weight_type::q4_0:
    case weight_type::q4_1:
    case weight_type::q5_0:
    case weight_type::q5_1:
    case weight_type::q8_0:
    case weight_type::q4_k:
    case weight_type::q5_k:
      return 32;
    case weight_type::q6_k:
      return 16;
    default:
      return 0;
  }
}

int64_t panel_min_act_rows(weight_type wt) {
  switch (wt) {
    case weight_type::q4_0:
    case weight_type::q5_0:
      return 4;
    case weight_type::q6_k:
      return 8;
    case weight_type::q4_1:
    case weight_type::q5_1:
      return 10;  // their ggml-order kernel carries two activation rows at a time
    default:
      return 6;
  }
}

size_t panel_bytes(weight_type wt, int64_t cols) {
  const int sub = panel_sub_elems(wt);
  return sub == 0 ? 0 : static_cast<size_t>(cols / sub) * sub_block_bytes(sub);
}

size_t panel_act_code_bytes(int64_t cols, int64_t n_x) { return static_cast<size_t>(cols * n_x); }

size_t panel_act_aux_floats(weight_type wt, int64_t cols, int64_t n_x) {
  const int sub = panel_sub_elems(wt);
  return sub == 0 ? 0 : static_cast<size_t>(cols / sub * k_panel_aux_per_sub * n_x);
}

int panel_code_offset(weight_type wt) {
  switch (wt) {
    case weight_type::q4_0:
      return -8;
    case weight_type::q5_0:
      return -16;
    case weight_type::q8_0:
      return -128;
    case weight_type::q6_k:
      return -32;
    default:
      return 0;
  }
}

void panel_decode_row(weight_type wt, const void* row, int64_t cols, uint8_t* codes, float* scale, float* min) {
  switch (wt) {
    case weight_type::q4_0: {
      const auto* b = static_cast<const block_q4_0*>(row);
      for (int64_t i = 0; i < cols / 32; ++i, codes += 32) {
        nibbles(b[i].qs, codes);
        scale[i] = half(b[i].d);
        min[i] = -8.0f * scale[i];
      }
      return;
    }
    case weight_type::q4_1: {
      const auto* b = static_cast<const block_q4_1*>(row);
      for (int64_t i = 0; i < cols / 32; ++i, codes += 32) {
        nibbles(b[i].qs, codes);
        scale[i] = half(b[i].d);
        min[i] = half(b[i].m);
      }
      return;
    }
    case weight_type::q5_0: {
      const auto* b = static_cast<const block_q5_0*>(row);
      for (int64_t i = 0; i < cols / 32; ++i, codes += 32) {
        nibbles(b[i].qs, codes);
        fifth_bits(b[i].qh, codes);
        scale[i] = half(b[i].d);
        min[i] = -16.0f * scale[i];
      }
      return;
    }
    case weight_type::q5_1: {
      const auto* b = static_cast<const block_q5_1*>(row);
      for (int64_t i = 0; i < cols / 32; ++i, codes += 32) {
        nibbles(b[i].qs, codes);
        fifth_bits(b[i].qh, codes);
        scale[i] = half(b[i].d);
        min[i] = half(b[i].m);
      }
      return;
    }
    case weight_type::q8_0: {
      const auto* b = static_cast<const block_q8_0*>(row);
      for (int64_t i = 0; i < cols / 32; ++i, codes += 32) {
        for (int j = 0; j < 32; ++j) codes[j] = static_cast<uint8_t>(b[i].qs[j] + 128);
        scale[i] = half(b[i].d);
        min[i] = -128.0f * scale[i];
      }
      return;
    }
    case weight_type::q4_k:
    case weight_type::q5_k: {
      const bool five = wt == weight_type::q5_k;
      const auto* b4 = static_cast<const block_q4_k*>(row);
      const auto* b5 = static_cast<const block_q5_k*>(row);
      for (int64_t i = 0; i < cols / 256; ++i, codes += 256, scale += 8, min += 8) {
        const uint8_t* qs = five ? b5[i].qs : b4[i].qs;
        const uint8_t* sc = five ? b5[i].scales : b4[i].scales;
        const float d = half(five ? b5[i].d : b4[i].d), dmin = half(five ? b5[i].dmin : b4[i].dmin);
        for (int c = 0; c < 4; ++c) {
          for (int l = 0; l < 32; ++l) {
            uint8_t lo = qs[32 * c + l] & 0xF, hi = qs[32 * c + l] >> 4;
            if (five) {
              lo |= static_cast<uint8_t>(((b5[i].qh[l] >> (2 * c)) & 1) << 4);
              hi |= static_cast<uint8_t>(((b5[i].qh[l] >> (2 * c + 1)) & 1) << 4);
            }
            codes[64 * c + l] = lo;
            codes[64 * c + 32 + l] = hi;
          }
        }
        for (int j = 0; j < 8; ++j) {
          uint8_t s, m;
          unpack_k_scale(sc, j, s, m);
          scale[j] = d * s;
          min[j] = -dmin * m;
        }
      }
      return;
    }
    case weight_type::q6_k: {
      const auto* b = static_cast<const block_q6_k*>(row);
      for (int64_t i = 0; i < cols / 256; ++i, codes += 256, scale += 16, min += 16) {
        for (int h = 0; h < 2; ++h) {
          const uint8_t* ql = b[i].ql + 64 * h;
          const uint8_t* qh = b[i].qh + 32 * h;
          for (int l = 0; l < 32; ++l) {
            int q[4];
            unpack_q6_k_codes(ql, qh, l, q);
            for (int k = 0; k < 4; ++k) codes[128 * h + 32 * k + l] = static_cast<uint8_t>(q[k] + 32);
          }
        }
        const float d = half(b[i].d);
        for (int j = 0; j < 16; ++j) {
          scale[j] = d * static_cast<float>(b[i].scales[j]);
          min[j] = -32.0f * scale[j];
        }
      }
      return;
    }
    default:
      throw std::invalid_argument("panel: no panel form for " + display_name(wt) + " weights");
  }
}

void pack_panel_ref(weight_type wt, const void* w, size_t w_row, int n_rows, int64_t cols, uint8_t* panel) {
  const int sub = panel_sub_elems(wt);
  const int64_t nsub = cols / sub;
  std::vector<uint8_t> codes(static_cast<size_t>(cols));
  std::vector<float> scale(static_cast<size_t>(nsub)), min(static_cast<size_t>(nsub));
  std::memset(panel, 0, panel_bytes(wt, cols));
  const size_t sb = sub_block_bytes(sub);
  for (int r = 0; r < n_rows; ++r) {
    panel_decode_row(wt, static_cast<const uint8_t*>(w) + r * w_row, cols, codes.data(), scale.data(), min.data());
    for (int64_t s = 0; s < nsub; ++s) {
      uint8_t* p = panel + s * sb;
      for (int e = 0; e < sub; ++e) p[(e / 4) * 64 + 4 * r + e % 4] = codes[static_cast<size_t>(s * sub + e)];
      auto* f = reinterpret_cast<float*>(p + (sub / 4) * 64);
      f[r] = scale[static_cast<size_t>(s)];
      f[k_panel_rows + r] = min[static_cast<size_t>(s)];
    }
  }
}

void panel_acts(weight_type wt, const void* act, size_t a_row, int64_t n_x, int64_t cols, int8_t* codes, float* aux) {
  const int sub = panel_sub_elems(wt);
  const weight_type at = activation_type(wt);
  const int offset = panel_code_offset(wt);
  constexpr int A = k_panel_aux_per_sub;
  auto put = [&](float* x, float da, float ds, int sum) {
    x[0] = da;
    x[1] = ds;
    const int32_t term = offset * sum;
    std::memcpy(x + 2, &term, sizeof term);
  };
  for (int64_t r = 0; r < n_x; ++r) {
    const auto* row = static_cast<const uint8_t*>(act) + r * a_row;
    int8_t* q = codes + r * cols;
    float* x = aux + r * (cols / sub) * A;
    if (at == weight_type::q8_0 || at == weight_type::q8_1) {
      const bool one = at == weight_type::q8_1;
      const size_t bytes = one ? sizeof(block_q8_1) : sizeof(block_q8_0);
      for (int64_t i = 0; i < cols / 32; ++i) {
        const uint8_t* blk = row + i * bytes;
        const int8_t* qs = reinterpret_cast<const int8_t*>(blk + (one ? 4 : 2));
        std::memcpy(q + 32 * i, qs, 32);
        half_bytes d, s;
        std::memcpy(d, blk, 2);
        const float da = half(d);
        int sum = 0;
        for (int j = 0; j < 32; ++j) sum += qs[j];
        float ds = da * static_cast<float>(sum);
        if (one) {
          std::memcpy(s, blk + 2, 2);
          ds = half(s);  // ggml's offset term uses the stored (rounded) d * sum
        }
        put(x + A * i, da, ds, sum);
      }
    } else if (at == weight_type::q8_k) {
      for (int64_t i = 0; i < cols / 256; ++i) {
        block_q8_k b;
        std::memcpy(&b, row + i * sizeof(block_q8_k), sizeof b);
        std::memcpy(q + 256 * i, b.qs, 256);
        const int per = 256 / sub;
        for (int j = 0; j < per; ++j) {
          const int sum = sub == 16 ? b.bsums[j] : b.bsums[2 * j] + b.bsums[2 * j + 1];
          put(x + A * (i * per + j), b.d, b.d * static_cast<float>(sum), sum);
        }
      }
    } else {
      throw std::invalid_argument("panel: no panel form for " + display_name(wt) + " weights");
    }
  }
}

namespace {
// The activation type of wt's panel form; throws unless wt has one for `cols` columns.
weight_type checked_act_type(weight_type wt, int64_t cols) {
  const weight_type at = activation_type(wt);
  if (!panel_supported(wt) || cols % info(at).block_elems != 0)
    throw std::invalid_argument("panel: no panel form of " + std::to_string(cols) + " columns for " + display_name(wt) + " weights");
  return at;
}
}  // namespace

void panel_act_row(weight_type wt, const float* x, int64_t cols, int8_t* codes, float* aux) {
  const weight_type at = checked_act_type(wt, cols);
  if (active_isa() == isa::avx512)
    return panel_act_row_avx512(at, panel_sub_elems(wt), panel_code_offset(wt), x, cols, codes, aux, 32, k_panel_aux_per_sub);
  thread_local std::vector<uint8_t> row;
  row.resize(static_cast<size_t>(row_bytes(at, cols)));
  quantize_activation_row(at, x, row.data(), cols);
  panel_acts(wt, row.data(), row.size(), 1, cols, codes, aux);
}

void tiled_act_row(weight_type wt, const float* x, int64_t cols, int r, int n_group, int8_t* tiled_codes, float* tiled_aux) {
  const weight_type at = checked_act_type(wt, cols);
  if (active_isa() == isa::avx512)
    return panel_act_row_avx512(at, panel_sub_elems(wt), panel_code_offset(wt), x, cols, tiled_codes + r * 32, tiled_aux + r * k_panel_aux_per_sub,
                                int64_t{32} * n_group, int64_t{k_panel_aux_per_sub} * n_group);
  thread_local std::vector<int8_t> codes;
  thread_local std::vector<float> aux;
  codes.resize(static_cast<size_t>(cols));
  aux.resize(panel_act_aux_floats(wt, cols, 1));
  panel_act_row(wt, x, cols, codes.data(), aux.data());
  tile_packed_act_row(wt, cols, codes.data(), aux.data(), r, n_group, tiled_codes, tiled_aux);
}

void panel_dot_ref(weight_type wt, const uint8_t* panel, int64_t cols, const int8_t* codes, const float* aux, int n_act, float* out,
                   int64_t out_stride, int n_w) {
  const int sub = panel_sub_elems(wt);
  const int64_t nsub = cols / sub;
  const size_t sb = sub_block_bytes(sub);
  for (int r = 0; r < n_act; ++r) {
    const int8_t* q = codes + r * cols;
    const float* x = aux + r * nsub * k_panel_aux_per_sub;
    for (int o = 0; o < n_w; ++o) {
      float acc = 0.0f;
      for (int64_t s = 0; s < nsub; ++s) {
        const uint8_t* p = panel + s * sb;
        int32_t dot = 0;
        for (int e = 0; e < sub; ++e) dot += p[(e / 4) * 64 + 4 * o + e % 4] * q[s * sub + e];
        const auto* f = reinterpret_cast<const float*>(p + (sub / 4) * 64);
        acc += f[o] * x[k_panel_aux_per_sub * s] * static_cast<float>(dot) + f[k_panel_rows + o] * x[k_panel_aux_per_sub * s + 1];
      }
      out[r * out_stride + o] = acc;
    }
  }
}

}  // namespace tandem::kernels::cpu
