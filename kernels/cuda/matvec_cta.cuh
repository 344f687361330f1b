// What the two decode matvecs (matvec.cu: f32 activations; matvec_q8.cu: int8 activations)
// share: one CTA of k_matvec_threads per output row, whose threads' partial sums for each of
// NX activation rows meet through shuffles and shared memory, and the dispatch of a run-time
// row count to the kernel instantiated for it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/ops.h"

namespace tandem::kernels::cuda::detail {

inline constexpr int k_matvec_threads = 128;
inline constexpr int k_matvec_warps = k_matvec_threads / 32;

// Sums acc[r] over the CTA's threads and writes it to y[r * rows + o]: the same order of adds
// for every NX, so a row's result does not depend on how many rows share the call.
template <int NX>
__device__ __forceinline__ void cta_sum_store(const float (&acc)[NX], float* __restrict__ y, int rows, int o) {
  __shared__ float partial[k_matvec_warps][NX];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < NX; ++r) {
    float s = acc[r];
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) s += __shfl_xor_sync(0xffffffffu, s, off);
    if (lane == 0) partial[warp][r] = s;
  }
  __syncthreads();
  if (threadIdx.x < NX) {
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < k_matvec_warps; ++i) s += partial[i][threadIdx.x];
    y[static_cast<int64_t>(threadIdx.x) * rows + o] = s;
  }
}

// Calls launch(std::integral_constant<int, n_x>{}) for n_x in 1 .. k_matvec_max_rows; other
// counts are the callers' to refuse before.
template <class F>
void dispatch_rows(int64_t n_x, F&& launch) {
  static_assert(k_matvec_max_rows == 8, "one case per row count");
  switch (n_x) {
    case 1:
      launch(std::integral_constant<int, 1>{});
      break;
    case 2:
      launch(std::integral_constant<int, 2>{});
      break;
    case 3:
      launch(std::integral_constant<int, 3>{});
      break;
    case 4:
      launch(std::integral_constant<int, 4>{});
      break;
    case 5:
      launch(std::integral_constant<int, 5>{});
      break;
    case 6:
      launch(std::integral_constant<int, 6>{});
      break;
    case 7:
      launch(std::integral_constant<int, 7>{});
      break;
    case 8:
      launch(std::integral_constant<int, 8>{});
      break;
    default:
      break;
  }
}

}  // namespace tandem::kernels::cuda::detail
