// Decode matvec: one CTA of 4 warps per output row. The row's blocks are dealt out to the
// CTA's threads (`lanes` consecutive threads per block), each thread dequantizes its part in
// registers and multiplies it into all n_x activation rows, so every weight byte is read once.
// A whole CTA per row (rather than a warp) keeps enough loads in flight on narrow matrices
// (few rows, e.g. the K/V projections); partial sums meet through shuffles and shared memory.
#include <cuda_runtime.h>

#include <climits>
#include <stdexcept>
#include <string>

#include "kernels/cuda/matvec_cta.cuh"
#include "kernels/cuda/ops.h"
#include "kernels/cuda/quant_blocks.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/op_table.h"

namespace tandem::kernels::cuda {
namespace {

constexpr int k_threads = detail::k_matvec_threads;

template <class B, int NX>
__global__ void __launch_bounds__(k_threads) matvec_kernel(const uint8_t* __restrict__ w, int64_t row_bytes, int n_items, int cols,
                                                           const float* __restrict__ x, int rows, float* __restrict__ y) {
  static_assert(k_threads % B::lanes == 0, "a thread's part must not change between iterations");
  const int o = blockIdx.x;
  const uint8_t* row = w + static_cast<int64_t>(o) * row_bytes;
  const int part = threadIdx.x % B::lanes;

  float acc[NX];
#pragma unroll
  for (int r = 0; r < NX; ++r) acc[r] = 0.0f;

#pragma unroll 2
  for (int it = threadIdx.x; it < n_items; it += k_threads) {
    const int blk = it / B::lanes;
    float v[B::n];
    B::decode(row + static_cast<int64_t>(blk) * B::bytes, part, v);
    const float* xb = x + static_cast<int64_t>(blk) * B::qk;
#pragma unroll
    for (int j = 0; j < B::n; ++j) {
      const int e = B::elem(part, j);
#pragma unroll
      for (int r = 0; r < NX; ++r) acc[r] = fmaf(v[j], __ldg(xb + static_cast<int64_t>(r) * cols + e), acc[r]);
    }
  }

  detail::cta_sum_store(acc, y, rows, o);
}

template <class B, int NX>
void launch(const void* w, int64_t rows, int64_t cols, const float* x, float* y, stream_t s) {
  const int64_t n_blocks = cols / B::qk;
  matvec_kernel<B, NX><<<static_cast<unsigned>(rows), k_threads, 0, s>>>(static_cast<const uint8_t*>(w), n_blocks * B::bytes,
                                                                         static_cast<int>(n_blocks * B::lanes), static_cast<int>(cols), x,
                                                                         static_cast<int>(rows), y);
}

template <class B>
void launch_nx(const void* w, int64_t rows, int64_t cols, const float* x, int64_t n_x, float* y, stream_t s) {
  detail::dispatch_rows(n_x, [&](auto nx) { launch<B, decltype(nx)::value>(w, rows, cols, x, y, s); });
}

}  // namespace

void matvec(weight_type wt, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n_x, float* y, stream_t s) {
  require(device_kind::cuda, op::matvec, wt);
  if (n_x < 0 || n_x > k_matvec_max_rows)
    throw std::invalid_argument("cuda matvec: n_x " + std::to_string(n_x) + " outside 0.." + std::to_string(k_matvec_max_rows));
  // Kernel indices within a row and the grid are 32-bit.
  if (rows < 0 || rows > INT_MAX || cols > INT_MAX)
    throw std::invalid_argument("cuda matvec: " + std::to_string(rows) + " x " + std::to_string(cols) + " is out of range");
  detail::check_blocks("matvec", wt, "cols", cols);
  detail::check_aligned("matvec", w);
  if (n_x == 0 || rows == 0) return;
  detail::visit_block(wt, [&](auto b) { launch_nx<decltype(b)>(w, rows, cols, x, n_x, y, s); });
  check_last("matvec");
}

}  // namespace tandem::kernels::cuda
