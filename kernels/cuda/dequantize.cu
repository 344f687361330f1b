// Whole-tensor dequantization to f16 (the cuBLAS prefill path) and the embedding gather. Both
// hand one (block, part) to each thread, as matvec does, so reads stay coalesced.
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <stdexcept>
#include <string>

#include "kernels/cuda/ops.h"
#include "kernels/cuda/quant_blocks.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/op_table.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int k_threads = 256;

template <class B>
__global__ void __launch_bounds__(k_threads) dequantize_f16_kernel(const uint8_t* __restrict__ w, int64_t n_items, uint16_t* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * k_threads;
  for (int64_t it = static_cast<int64_t>(blockIdx.x) * k_threads + threadIdx.x; it < n_items; it += stride) {
    const int64_t blk = it / B::lanes;
    const int part = static_cast<int>(it % B::lanes);
    float v[B::n];
    B::decode(w + blk * B::bytes, part, v);
    uint16_t* o = out + blk * B::qk;
#pragma unroll
    for (int j = 0; j < B::n; ++j) o[B::elem(part, j)] = __half_as_ushort(__float2half_rn(v[j]));
  }
}

// One CTA per gathered row; rows are as long as a model's hidden size, so a CTA has work.
template <class B>
__global__ void __launch_bounds__(k_threads) get_rows_kernel(const uint8_t* __restrict__ table, int64_t row_bytes, int n_items, int64_t cols,
                                                             const int32_t* __restrict__ ids, float* __restrict__ out) {
  const int64_t r = blockIdx.x;
  const uint8_t* row = table + static_cast<int64_t>(ids[r]) * row_bytes;
  float* o = out + r * cols;
  const int part = threadIdx.x % B::lanes;
  for (int it = threadIdx.x; it < n_items; it += k_threads) {
    const int blk = it / B::lanes;
    float v[B::n];
    B::decode(row + static_cast<int64_t>(blk) * B::bytes, part, v);
#pragma unroll
    for (int j = 0; j < B::n; ++j) o[static_cast<int64_t>(blk) * B::qk + B::elem(part, j)] = v[j];
  }
}

}  // namespace

void dequantize_f16(weight_type wt, const void* w, int64_t n_elems, uint16_t* out, stream_t s) {
  require(device_kind::cuda, op::dequantize, wt);
  detail::check_blocks("dequantize_f16", wt, "n_elems", n_elems);
  detail::check_aligned("dequantize_f16", w);
  if (n_elems == 0) return;
  if (wt == weight_type::f16) {
    // Already the target format: a copy keeps NaN payloads a round trip through f32 might not.
    cudaMemcpyAsync(out, w, static_cast<size_t>(n_elems) * 2, cudaMemcpyDeviceToDevice, s);
    check_last("dequantize_f16");
    return;
  }
  detail::visit_block(wt, [&](auto b) {
    using B = decltype(b);
    const int64_t n_items = n_elems / B::qk * B::lanes;
    // Grid-stride loop: a capped grid still covers the largest tensors.
    const int64_t grid = std::min<int64_t>((n_items + k_threads - 1) / k_threads, int64_t{1} << 20);
    dequantize_f16_kernel<B><<<static_cast<unsigned>(grid), k_threads, 0, s>>>(static_cast<const uint8_t*>(w), n_items, out);
  });
  check_last("dequantize_f16");
}

void get_rows(weight_type wt, const void* table, int64_t cols, const int32_t* ids, int64_t n, float* out, stream_t s) {
  require(device_kind::cuda, op::get_rows, wt);
  if (n < 0 || n > INT_MAX || cols > INT_MAX)
    throw std::invalid_argument("cuda get_rows: " + std::to_string(n) + " rows of " + std::to_string(cols) + " is out of range");
  detail::check_blocks("get_rows", wt, "cols", cols);
  detail::check_aligned("get_rows", table);
  if (n == 0 || cols == 0) return;
  detail::visit_block(wt, [&](auto b) {
    using B = decltype(b);
    const int64_t n_blocks = cols / B::qk;
    get_rows_kernel<B><<<static_cast<unsigned>(n), k_threads, 0, s>>>(static_cast<const uint8_t*>(table), n_blocks * B::bytes,
                                                                      static_cast<int>(n_blocks * B::lanes), cols, ids, out);
  });
  check_last("get_rows");
}

}  // namespace tandem::kernels::cuda
