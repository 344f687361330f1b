// Weights repacked once, at load, into 16-row panels (llama.cpp's "repacked" CPU buffers do
// the same). The panels of panel.h are built per call from GGUF rows and hold one byte per
// code plus float scales: fine when many activation rows share them, too big and too slow to
// build for decode. Packed weights keep the panel arrangement (16 rows across the int32 lanes
// of a register) in a compact form about as large as the GGUF blocks, so every product reads
// one sequential stream of bytes and needs no packing at all:
//  - decode (one activation row) spends ~4x fewer instructions per weight byte than the row
//    tiles and runs at memory speed;
//  - batched decode and prefill skip the packing pass.
//
// Layout: panels of 16 rows (the last one padded with zero rows), one after another; within
// a panel, 32-column chunks. Group k of a chunk (columns 4k..4k+3) decodes to 64 bytes, byte
// 4r + e = code of row r, column 4k + e, as in panel.h.
//   Q4_0  per chunk: 4 x 64 nibble bytes (byte i of register q: group q low, group q+4 high),
//         16 fp16 d                                                           288 B (= GGUF)
//   Q4_1  per chunk: nibbles, 16 fp16 d, 16 fp16 m                            320 B (= GGUF)
//   Q5_0  per chunk: nibbles as Q4_0, 8 fifth-bit masks, 16 fp16 d              352 B (= GGUF)
//   Q5_1  per chunk: nibbles, 8 fifth-bit masks, 16 fp16 d, 16 fp16 m          384 B (= GGUF)
//   Q8_0  per chunk: 8 x 64 code bytes (q + 128), 16 fp16 d                   544 B (= GGUF)
//   Q4_K  per 256 columns: 8 chunks of nibbles, 16 fp16 d, 16 fp16 dmin, 8 x 16 scales,
//         8 x 16 mins (6-bit values in bytes)                              2368 B (GGUF 2304)
//   Q5_K  per 256 columns: as Q4_K with 8 chunks of 8 fifth-bit masks after the nibbles
//                                                                          2880 B (GGUF 2816)
//   Q6_K  per 256 columns: 8 chunks of low nibbles, 8 x 2 x 64 bytes of high 2-bit pairs
//         (register h holds groups 4h..4h+3 at bits 2j), 16 fp16 d, 16 x 16 int8 scales
//                                                                             3360 B (= GGUF)
// A fifth-bit mask is a little-endian uint64 per group k of a chunk: bit 4r + e holds bit 4
// of the code of row r, column 4k + e (the AVX-512 kernels load it as a byte mask and add 16
// under it). Other types are not packed and keep the row layout.
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/isa.h"
#include "kernels/weight_type.h"

namespace tandem::kernels::cpu {

// How a weight matrix lies in memory: GGUF rows, or packed panels (this header).
enum class weight_layout { rows, packed };

// Where things lie in one packed unit (a 32-column chunk; 256 columns for K-quants), for the
// packer and every kernel alike (static, as every helper the ISA-specific files share: no copy
// built for a wider instruction set can stand in for baseline code's). Its size (0: no packed
// form):
static constexpr size_t packed_unit_bytes(weight_type wt) {
  constexpr size_t R = 16;  // k_panel_rows (panel.h)
  switch (wt) {
    case weight_type::q4_0:
      return 4 * 64 + 2 * R;
    case weight_type::q4_1:
      return 4 * 64 + 4 * R;
    case weight_type::q5_0:
      return 4 * 64 + 64 + 2 * R;
    case weight_type::q5_1:
      return 4 * 64 + 64 + 4 * R;
    case weight_type::q8_0:
      return 8 * 64 + 2 * R;
    case weight_type::q4_k:
      return 8 * 4 * 64 + 4 * R + 16 * R;
    case weight_type::q5_k:
      return 8 * 4 * 64 + 8 * 64 + 4 * R + 16 * R;
    case weight_type::q6_k:
      return 8 * 4 * 64 + 8 * 2 * 64 + 2 * R + 16 * R;
    default:
      return 0;
  }
}
// Columns per unit: 256 for the K-quants (one super-block), 32 for the rest.
static constexpr int64_t packed_unit_cols(weight_type wt) {
  return wt == weight_type::q4_k || wt == weight_type::q5_k || wt == weight_type::q6_k ? 256 : 32;
}
// The offset of its scales (after the codes).
static constexpr size_t packed_scales_at(weight_type wt) {
  switch (wt) {
    case weight_type::q4_0:
    case weight_type::q4_1:
      return 256;
    case weight_type::q5_0:
    case weight_type::q5_1:
      return 320;
    case weight_type::q8_0:
      return 512;
    case weight_type::q4_k:
      return 2048;
    case weight_type::q5_k:
      return 2560;
    default:
      return 3072;  // q6_k
  }
}
// Whether codes have a fifth bit (Q5_0, Q5_1, Q5_K), and the offset of chunk ch's 8 masks.
static constexpr bool packed_has_fifth_bit(weight_type wt) { return wt == weight_type::q5_0 || wt == weight_type::q5_1 || wt == weight_type::q5_k; }
static constexpr size_t packed_fifth_at(weight_type wt, int ch) { return (wt == weight_type::q5_k ? 2048 : 256) + static_cast<size_t>(ch) * 64; }

// How far ahead of its reads a packed product asks for each line, and how much of a piece's
// start it asks for at once (matmul.cpp), on every SIMD path: two threads' decode ran 3-9%
// faster than at 4 KiB where two cores read 60-80 GB/s; 12 and 16 KiB were slower.
inline constexpr size_t k_packed_prefetch_ahead = 8192;
// The AVX2 kernels ask for each line twice instead: into L2 k_packed_l2_ahead_avx2 ahead, and
// into L1 k_packed_l1_ahead_avx2 ahead. A request into L1 holds one of the core's few L1 miss
// buffers until its line arrives, so requests aimed at L1 alone capped one core's stream
// (2-9% slower on a Zen 2); requests into L2 can have many more lines in flight.
inline constexpr size_t k_packed_l1_ahead_avx2 = 2048;
inline constexpr size_t k_packed_l2_ahead_avx2 = 16384;
// Except, on AMD, decode passes (1-2 activation rows) of Q4_0, Q8_0 and tile-order Q4_1, which
// read their units front to back: the core's own stream prefetcher runs far ahead of them and
// the far requests only took its load slots, so they ask once, k_packed_near_ahead_avx2 ahead
// (Zen 2 decode: Q4_0 +7%, Q8_0 +12%). Passes of more rows, the K-quants (scales read in every
// chunk), the Q5 types and the ggml-order pass keep both levels: near requests alone were slower.
// The near request is non-temporal (prefetchnta): a decode pass reads each line once, and
// lines that leave early push out less of what the step reads again (+2-5% decode on Zen 2).
inline constexpr size_t k_packed_near_ahead_avx2 = 640;
// Q4_0's near request on AMD family 19h (Zen 3, and Zen 4 when the avx2 path is forced)
// instead: on a Zen 3, 1,536 bytes decoded Q4_0 8-11% faster than 640 (a narrow peak); Q8_0
// and the Zen 2 measured best at 640.
inline constexpr size_t k_packed_q4_0_near_ahead_zen3 = 1536;
// The near distance for a CPU: k_packed_q4_0_near_ahead_zen3 for Q4_0 on AMD family 19h,
// k_packed_near_ahead_avx2 otherwise.
size_t packed_near_ahead_avx2_for(weight_type wt, const cpu_identity& cpu);
// The same for this CPU, chosen once at start-up (a constant to the kernels' loops).
extern const size_t g_packed_q4_0_near_ahead_avx2;
inline size_t packed_near_ahead_avx2(weight_type wt) { return wt == weight_type::q4_0 ? g_packed_q4_0_near_ahead_avx2 : k_packed_near_ahead_avx2; }

// Whether `wt` has a packed form (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K).
bool packable(weight_type wt);
// Whether load-time packing pays: a packed type and the AVX-512 or AVX2 path active. (Packed
// weights compute on the scalar path too, but only through the slow portable kernel.)
bool pack_at_load(weight_type wt);
// Bytes of a packed rows x cols matrix (cols a multiple of the type's block size).
size_t packed_bytes(weight_type wt, int64_t rows, int64_t cols);
// Packs `rows` GGUF rows (row_bytes(wt, cols) apart) into dst (packed_bytes(wt, rows, cols)).
// Throws std::invalid_argument for types without a packed form.
void pack_weights(weight_type wt, const void* src, int64_t rows, int64_t cols, void* dst);
// Row `row` of a packed matrix as floats: the same values as dequantize_row of the GGUF row.
void dequantize_packed_row(weight_type wt, const void* packed, int64_t cols, int64_t row, float* out);

// The float order of a packed Q4_1 or Q5_1 product on the AVX-512 and AVX2 paths (the other
// types have one):
//  - ggml: ggml's x86 order, bit for bit the row kernels and llama.cpp (8 float lanes per
//    row, so a pass carries 2 activation rows): what `tandem run` computes;
//  - tile: the tile kernel's, one accumulator per row and sub-block as for Q4_0, up to 16 rows
//    a pass; within float rounding of ggml's (the server's arithmetic, set_prompt_end).
// Either way a row's result does not depend on the other rows of the call.
enum class sum_order { ggml, tile };

// How an AVX-512 pass of `wt` in `order` over `act_rows` activation rows asks for its lines
// ahead of reading them, on a CPU whose own prefetchers do (`self_streaming`: AMD) or do not
// keep up with a packed stream read front to back:
//  - l1: every line k_packed_prefetch_ahead ahead, into L1 (passes of several rows on AMD, and
//    of Q4_K, Q4_1 and Q5_1 elsewhere; decode over the types not named below on AMD);
//  - none: not at all, in decode over Q4_0, Q8_0 and ggml-order Q4_1 on AMD, which read each
//    unit front to back: the core's own prefetchers keep up and requests only took load slots
//    (Zen 4 decode up to 15% faster without). Units holding two or three streams read at
//    different offsets (the other types) streamed slower without requests;
//  - l2_and_l1: in decode over Q4_K and Q6_K, and in every pass where the CPU is not AMD but
//    those named under l1, every line twice, k_packed_l2_ahead_avx512 ahead into L2 and
//    k_packed_l1_ahead_avx512 ahead into L1, as the AVX2 kernels ask: requests into L2 can have
//    more lines in flight than the L1 miss buffers (an Intel Xeon's decode up to 80% faster than
//    with l1 or none; its Q4_K batches 5% slower, so they keep l1; Q5_1 goes with Q4_1).
enum class avx512_requests { none, l1, l2_and_l1 };
// The AVX2 kernels' distances (other distances measured no faster).
inline constexpr size_t k_packed_l1_ahead_avx512 = k_packed_l1_ahead_avx2;
inline constexpr size_t k_packed_l2_ahead_avx512 = k_packed_l2_ahead_avx2;
static constexpr avx512_requests packed_avx512_requests(weight_type wt, int act_rows, sum_order order, bool self_streaming) {
  if (act_rows != 1) {
    if (self_streaming || wt == weight_type::q4_k || wt == weight_type::q4_1 || wt == weight_type::q5_1) return avx512_requests::l1;
    return avx512_requests::l2_and_l1;
  }
  if (wt == weight_type::q4_k || wt == weight_type::q6_k || !self_streaming) return avx512_requests::l2_and_l1;
  if (wt == weight_type::q4_0 || wt == weight_type::q8_0) return avx512_requests::none;
  if (wt == weight_type::q4_1 && order == sum_order::ggml) return avx512_requests::none;
  return avx512_requests::l1;
}
// Whether `cpu`'s own prefetchers keep up with a front-to-back packed stream: measured so on
// AMD (Zen 2, 3 and 4) and not on an Intel Xeon (on both SIMD paths), so AMD it is.
inline bool streams_prefetch_themselves(const cpu_identity& cpu) { return cpu.amd; }
// streams_prefetch_themselves(this_cpu()), read once.
extern const bool g_packed_self_streaming;
// packed_avx512_requests for this CPU.
inline avx512_requests packed_avx512_requests(weight_type wt, int act_rows, sum_order order) {
  return packed_avx512_requests(wt, act_rows, order, g_packed_self_streaming);
}

// Whether an AVX-512 tile pass of `act_rows` (2..8) rows on `cpu` splits each row's integer
// sum of a chunk into two chains (even and odd column groups, or low and high nibbles) added
// before the conversion. On a Zen 4 one chain of 8 vpdpbusd per row outlasted a pass over 8
// rows and the core waited on it (split, batched decode of 16 ran 9% faster); on an Intel
// Xeon passes of 8 rows ran 3-8% faster with one sum per row, passes of 2-4 did not.
static constexpr bool packed_avx512_split_sums(int act_rows, const cpu_identity& cpu) { return cpu.amd || act_rows < 8; }
// packed_avx512_split_sums(8, this_cpu()), read once.
extern const bool g_packed_split_sums8;

// Whether the AVX2 decode passes (1-2 activation rows) of `wt` in `order` ask for lines at the
// two distances above (true) or once, k_packed_near_ahead_avx2 ahead, on a CPU whose own
// prefetchers do (`self_streaming`: AMD) or do not keep up with a packed stream. Passes of more
// rows always ask at both, and so does every pass where the CPU is not AMD: on an Intel Xeon
// the near request alone left Q4_0 decode at 0.29 of the read ceiling.
static constexpr bool packed_avx2_two_levels(weight_type wt, sum_order order, bool self_streaming) {
  if (!self_streaming) return true;
  if (wt == weight_type::q4_0 || wt == weight_type::q8_0) return false;
  return !(wt == weight_type::q4_1 && order == sum_order::tile);
}
// packed_avx2_two_levels for this CPU.
inline bool packed_avx2_two_levels(weight_type wt, sum_order order) { return packed_avx2_two_levels(wt, order, g_packed_self_streaming); }
// Whether `wt` has both orders (Q4_1, Q5_1: the types with a min whose kernel is not repacked
// in llama.cpp, so its plain kernel's order is what llama.cpp computes).
static constexpr bool has_ggml_order(weight_type wt) { return wt == weight_type::q4_1 || wt == weight_type::q5_1; }

// Activation rows one AVX-512 call over a packed panel takes. Exactly this many pass over the
// weights once for every type but Q6_K and ggml-order Q4_1/Q5_1 (one integer sum per row: at 16 rows
// the pass outlasts its latency, and the nibbles are widened once for all 16); other counts
// and types go in passes of up to k_panel_max_act_rows.
inline constexpr int k_packed_max_act_rows = 16;

// Products over packed panels: out[r * out_stride + o] = dot(row o of the panel at `panel`,
// activation row r) for r < n_act, o < n_w (1..16). Activations in panel.h's form
// (panel_acts: int8 codes, per sub-block {da, da * sum, offset term}). Both take any number of
// rows.
void packed_dot_ref(weight_type wt, const uint8_t* panel, int64_t cols, const int8_t* codes, const float* aux, int n_act, float* out,
                    int64_t out_stride, int n_w);
// order: see sum_order. Any n_act: groups of up to
// k_packed_max_act_rows rows go through tile_packed_acts and packed_dot_tiled_avx512 (a copy
// per call; matmul tiles each activation row once instead).
void packed_dot_avx512(weight_type wt, const uint8_t* panel, int64_t cols, const int8_t* codes, const float* aux, int n_act, float* out,
                       int64_t out_stride, int n_w, sum_order order = sum_order::ggml);

// The AVX2 form (packed_avx2.cpp) for CPUs without AVX-512: panel_acts rows, any n_act, in
// passes of up to 4 rows. The same bits as packed_dot_avx512 in both orders (its integer sums
// are exact and its float steps are the AVX-512 kernels'), so a product does not depend on which
// of the two paths computes it.
// allow_vnni: take the AVX-VNNI kernels where avx_vnni_active() (the same bits; tests turn it
// off to compare).
void packed_dot_avx2(weight_type wt, const uint8_t* panel, int64_t cols, const int8_t* codes, const float* aux, int n_act, float* out,
                     int64_t out_stride, int n_w, sum_order order = sum_order::ggml, bool allow_vnni = true);
// The AVX-VNNI kernels (packed_vnni_avx2.cpp); only call when avx_vnni_active().
void packed_dot_avxvnni(weight_type wt, const uint8_t* panel, int64_t cols, const int8_t* codes, const float* aux, int n_act, float* out,
                        int64_t out_stride, int n_w, sum_order order = sum_order::ggml);

// The tiled form of a group of n_group (1..k_packed_max_act_rows) activation rows, what the
// AVX-512 tile kernel reads: codes chunk by chunk, code (r, c) at ((c / 32) * n_group + r) *
// 32 + c % 32, and the aux floats sub-block by sub-block, those of (r, sub-block s) at
// (s * n_group + r) * k_panel_aux_per_sub. One row's tiled form is its panel_acts form.
// tile_packed_act_row writes row r of the group from its panel_acts row (codes: cols bytes,
// aux: panel_act_aux_floats(wt, cols, 1) floats); tile_packed_acts every row.
void tile_packed_act_row(weight_type wt, int64_t cols, const int8_t* codes, const float* aux, int r, int n_group, int8_t* tiled_codes,
                         float* tiled_aux);
void tile_packed_acts(weight_type wt, int64_t cols, const int8_t* codes, const float* aux, int n_group, int8_t* tiled_codes, float* tiled_aux);
// packed_dot_avx512 over the tiled form of a group of n_act (1..k_packed_max_act_rows) rows,
// for every type and order except ggml-order Q4_1/Q5_1, whose kernel reads panel_acts rows (the
// call then does nothing; matmul never makes it).
void packed_dot_tiled_avx512(weight_type wt, const uint8_t* panel, int64_t cols, const int8_t* tiled_codes, const float* tiled_aux, int n_act,
                             float* out, int64_t out_stride, int n_w, sum_order order = sum_order::ggml);
// Widens one packed panel into panel.h's form (64-byte aligned panel, panel_bytes(wt, cols)):
// the codes pack_panel_* writes from the GGUF rows and the same scale and min values (padded
// rows: -0 where pack_panel_* writes +0), for products with many activation rows
// (panel_dot_avx512 then reuses the wide codes on every pass).
void expand_packed_avx512(weight_type wt, const uint8_t* packed, int64_t cols, uint8_t* panel);
// Activation rows from which matmul expands packed panels instead of reading them directly.
inline constexpr int64_t k_expand_min_act_rows = 32;
// Bytes of one packed panel of `cols` columns.
size_t packed_panel_bytes(weight_type wt, int64_t cols);

}  // namespace tandem::kernels::cpu
