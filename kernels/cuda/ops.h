// The CUDA twins of the CPU ops (kernels/cpu/ops.h, matmul.h), callable from plain C++.
// Every pointer is device memory unless its comment says otherwise; every call only enqueues
// work on `s` (nothing waits, nothing allocates), and reports launch errors by throwing
// std::runtime_error naming the op. Weight types are checked against the dispatch table
// (kernels/op_table.h): an unsupported (op, type) pair throws std::invalid_argument listing
// the supported ones. Built only with the CUDA backend (TANDEM_HAVE_CUDA).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/ops.h"
#include "kernels/weight_type.h"

struct CUstream_st;

namespace tandem::kernels::cuda {

using stream_t = CUstream_st*;  // the same type as cudaStream_t; null is the legacy stream

// ---- weights × activations -------------------------------------------------------------

// Decode: y[r * rows + o] = sum_i W[o, i] * x[r * cols + i] for r < n_x <= k_matvec_max_rows,
// reading each weight block once for all n_x rows and dequantizing it in registers (no
// temporary copy of the weights). W is `rows` GGUF rows of `cols` elements of `wt` (file
// layout); x is f32 and stays f32 (matvec_q8 below quantizes it).
inline constexpr int64_t k_matvec_max_rows = 8;
void matvec(weight_type wt, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n_x, float* y, stream_t s);

// The same product on integer dot products: x is first quantized to int8 per 32 values (the
// CPU's Q8_0 activation codes, the scale amax / 127 kept in f32) into `scratch`, then each
// weight part is multiplied four codes at a time (dp4a) and scaled once per sub-block, as
// llama.cpp's MMVQ. About one instruction per weight instead of six, which is what decode is
// bound by on a large GPU. Types: matvec_q8_supports (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K,
// Q6_K); scratch is device memory of at least matvec_q8_scratch_bytes(cols, n_x) bytes,
// 16-byte aligned.
bool matvec_q8_supports(weight_type wt);
size_t matvec_q8_scratch_bytes(int64_t cols, int64_t n_x);
void matvec_q8(weight_type wt, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n_x, float* y, void* scratch, size_t scratch_size,
               stream_t s);
// matvec_q8 in two steps, for several matrices over the same activations (Q, K and V; gate
// and up): quantize_q8 fills scratch once, and each matvec_q8_quantized reads it. The int8
// form does not depend on the weight type, so the matrices may differ in type.
void quantize_q8(const float* x, int64_t n_x, int64_t cols, void* scratch, size_t scratch_size, stream_t s);
void matvec_q8_quantized(weight_type wt, const void* w, int64_t rows, int64_t cols, const void* xq_scratch, size_t scratch_size, int64_t n_x,
                         float* y, stream_t s);

// W (n_elems elements of wt, whole blocks) converted to f16 (IEEE half bits) into out.
void dequantize_f16(weight_type wt, const void* w, int64_t n_elems, uint16_t* out, stream_t s);

// Prefill and large batches: W dequantized into an f16 scratch, x converted to f16, one
// cublasGemmEx with f32 accumulation. Owns the cuBLAS handle; scratch is the caller's (the
// arbiter's scratch allocation), at least scratch_bytes(rows, cols, n_x).
class gemm {
 public:
  explicit gemm(stream_t s);
  ~gemm();
  gemm(const gemm&) = delete;
  gemm& operator=(const gemm&) = delete;

  // Up to k_matvec_max_rows rows: matvec_q8's int8 activations; more: the f16 copies of W and x.
  static size_t scratch_bytes(int64_t rows, int64_t cols, int64_t n_x);
  // y = W x for any n_x >= 1. Up to k_matvec_max_rows rows take matvec_q8 for the types it
  // has, when scratch holds matvec_q8_scratch_bytes(cols, n_x) at a 16-byte boundary, and
  // matvec otherwise.
  void run(weight_type wt, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n_x, float* y, void* scratch, size_t scratch_bytes);
  stream_t stream() const { return s_; }
  // cuBLAS's workspace from memory the caller owns (the arbiter's scratch) instead of its own
  // allocation; must outlive the object, at least k_workspace_bytes.
  void set_workspace(void* p, size_t bytes);
  // Enough for the GEMMs of a forward pass on every architecture (cuBLAS asks for 32 MiB at
  // most, on Hopper; it picks algorithms that need less when given less).
  static constexpr size_t k_workspace_bytes = size_t{32} << 20;

 private:
  stream_t s_;
  void* handle_ = nullptr;  // cublasHandle_t
};

// out[r * cols ..] = row ids[r] of the table (the token embedding), dequantized to f32.
// ids is device memory; every id must be in [0, rows).
void get_rows(weight_type wt, const void* table, int64_t cols, const int32_t* ids, int64_t n, float* out, stream_t s);

// ---- element-wise ----------------------------------------------------------------------

// Row r: out = x / sqrt(mean(x^2) + eps) * w (w may be null); n_rows rows of n floats, rows
// contiguous. out may equal x. Also the per-head q/k norms (n = head_dim, n_rows = heads*rows).
void rms_norm(const float* x, const float* w, float* out, int64_t n_rows, int64_t n, float eps, stream_t s);

// RoPE in place on n_rows rows of n_heads * head_dim floats (row stride row_stride floats);
// row r at position pos[r]. p as on the CPU, except p.freq_factors is ignored and
// freq_factors (device, n_rot/2 floats, or null) is used instead.
void rope(float* x, int64_t n_rows, int64_t row_stride, int n_heads, int head_dim, const int32_t* pos, const cpu::rope_params& p,
          const float* freq_factors, stream_t s);

void swiglu(float* gate, const float* up, int64_t n, stream_t s);                // gate = silu(gate) * up
void add(float* x, const float* y, int64_t n, stream_t s);                       // x += y
void add_rows(float* x, const float* b, int64_t n_rows, int64_t n, stream_t s);  // x[r] += b
void softmax(float* x, int64_t n_rows, int64_t n, stream_t s);                   // per row, in place

// ---- paged KV and attention ------------------------------------------------------------

// One layer of a paged KV cache, laid out as the CPU's (memory/kv_pool.h, models/forward.h):
// position p of a sequence with block table t is at byte t[p / block_tokens] * block_stride +
// (p % block_tokens) * kv_bytes(type, row_elems) of k (the same for v). q8_0 and q4_0 rows are
// ggml's blocks of 32 (kernels/cpu/ops.h), so row_elems and head_dim are multiples of 32.
struct paged_layer {
  void* k = nullptr;
  void* v = nullptr;
  cpu::kv_type type = cpu::kv_type::f16;
  int64_t block_tokens = 16;
  int64_t block_stride = 0;  // bytes from one block to the next
  int64_t row_elems = 0;     // n_kv_heads * head_dim
};

// Which rows of a batch belong where: row r is at position pos[r] of the sequence whose block
// table starts at tables + table_of_row[r] (all device memory).
struct row_map {
  const int32_t* pos = nullptr;
  const int32_t* tables = nullptr;
  const int32_t* table_of_row = nullptr;
};

// Writes n_rows rows of K and V (row_elems floats each, contiguous) at their positions,
// converting to the cache type (f16: round to nearest even; q8_0 and q4_0: the formulas of
// ggml's reference quantizers, as the CPU's kv_store).
void kv_store(const paged_layer& kv, const float* k_rows, const float* v_rows, int64_t n_rows, const row_map& rows, stream_t s);

// Causal grouped-query attention over the paged cache, for decode (one row per sequence) and
// prefill (many rows of one or more sequences) alike: row r attends positions 0 .. pos[r] of
// its sequence (already stored). q and out: [n_rows][n_heads][head_dim], out not aliasing q.
// f32 arithmetic with an online softmax (within float noise of the CPU twin), quantized rows
// dequantized as they are read.
void attention(const float* q, float* out, int64_t n_rows, const row_map& rows, const paged_layer& kv, int n_heads, int n_kv_heads, int head_dim,
               float scale, stream_t s);

// cpu::hadamard_heads on the device: each head_dim-wide head (a power of two, at most 256) of
// n_rows rows (row stride row_stride floats, n_heads heads) rotated in place.
void hadamard_heads(float* x, int64_t n_rows, int64_t row_stride, int n_heads, int head_dim, stream_t s);

// ---- sampling helpers ------------------------------------------------------------------

// out[r] = index of the largest of row r's n floats (the lowest index on ties).
void argmax(const float* x, int64_t n_rows, int64_t n, int32_t* out, stream_t s);
// The k largest of n floats, largest first (ties: lower index first), 1 <= k <= k_top_k_max.
inline constexpr int k_top_k_max = 64;
void top_k(const float* x, int64_t n, int k, float* values, int32_t* ids, stream_t s);

}  // namespace tandem::kernels::cuda
