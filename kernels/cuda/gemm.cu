// Prefill and large batches through cuBLAS. Quantized weights are expanded to f16 in the
// caller's scratch first: one dequantization pass is cheap next to a GEMM over many rows, and
// it lets tensor cores do the multiply with f32 accumulation.
//
// Layout: cuBLAS is column-major. Row-major W [rows][cols] is column-major cols x rows (ld cols),
// row-major x [n_x][cols] is cols x n_x (ld cols) and row-major y [n_x][rows] is rows x n_x
// (ld rows), so y = W^T(col-major) * x: op T on A = W, op N on B = x, m = rows, n = n_x, k = cols.
#include <cublas_v2.h>
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
constexpr size_t k_scratch_align = 256;

size_t round_up(size_t n) { return (n + k_scratch_align - 1) / k_scratch_align * k_scratch_align; }

void check_cublas(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(std::string("cuda: ") + what + ": " + cublasGetStatusName(st));
}

__global__ void __launch_bounds__(k_threads) to_f16_kernel(const float* __restrict__ x, int64_t n, __half* __restrict__ out) {
  const int64_t stride = static_cast<int64_t>(gridDim.x) * k_threads;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * k_threads + threadIdx.x; i < n; i += stride) out[i] = __float2half_rn(x[i]);
}

}  // namespace

gemm::gemm(stream_t s) : s_(s) {
  cublasHandle_t h = nullptr;
  check_cublas(cublasCreate(&h), "cublasCreate");
  const cublasStatus_t st = cublasSetStream(h, s);
  if (st != CUBLAS_STATUS_SUCCESS) {
    cublasDestroy(h);
    check_cublas(st, "cublasSetStream");
  }
  handle_ = h;
}

void gemm::set_workspace(void* p, size_t bytes) {
  check_cublas(cublasSetWorkspace(static_cast<cublasHandle_t>(handle_), p, bytes), "cublasSetWorkspace");
}

gemm::~gemm() {
  if (handle_) cublasDestroy(static_cast<cublasHandle_t>(handle_));
}

size_t gemm::scratch_bytes(int64_t rows, int64_t cols, int64_t n_x) {
  if (n_x <= k_matvec_max_rows) return matvec_q8_scratch_bytes(cols, n_x);
  return round_up(static_cast<size_t>(rows) * static_cast<size_t>(cols) * 2) + round_up(static_cast<size_t>(n_x) * static_cast<size_t>(cols) * 2);
}

void gemm::run(weight_type wt, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n_x, float* y, void* scratch, size_t scratch_size) {
  if (n_x <= k_matvec_max_rows) {
    if (matvec_q8_supports(wt) && scratch && reinterpret_cast<uintptr_t>(scratch) % 16 == 0 && scratch_size >= matvec_q8_scratch_bytes(cols, n_x))
      matvec_q8(wt, w, rows, cols, x, n_x, y, scratch, scratch_size, s_);
    else
      matvec(wt, w, rows, cols, x, n_x, y, s_);
    return;
  }
  require(device_kind::cuda, op::matmul, wt);
  // cuBLAS takes int dimensions.
  if (rows < 0 || rows > INT_MAX || cols < 0 || cols > INT_MAX || n_x > INT_MAX)
    throw std::invalid_argument("cuda gemm: " + std::to_string(rows) + " x " + std::to_string(cols) + " by " + std::to_string(n_x) +
                                " rows is out of range");
  detail::check_blocks("gemm", wt, "cols", cols);
  detail::check_aligned("gemm", w);
  const size_t need = gemm::scratch_bytes(rows, cols, n_x);
  if (scratch_size < need)
    throw std::invalid_argument("cuda gemm: scratch of " + std::to_string(scratch_size) + " bytes, needs " + std::to_string(need));
  if (rows == 0) return;
  if (cols == 0) {  // empty sums; cuBLAS would reject lda = 0
    cudaMemsetAsync(y, 0, static_cast<size_t>(n_x) * static_cast<size_t>(rows) * sizeof(float), s_);
    check_last("gemm");
    return;
  }

  auto* h = static_cast<cublasHandle_t>(handle_);
  const int m = static_cast<int>(rows), n = static_cast<int>(n_x), k = static_cast<int>(cols);
  const float alpha = 1.0f, beta = 0.0f;
  if (wt == weight_type::f32) {
    // F32 weights (small test models) skip the f16 round trip: exact inputs, no extra passes.
    check_cublas(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, w, CUDA_R_32F, k, x, CUDA_R_32F, k, &beta, y, CUDA_R_32F, m,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "cublasGemmEx");
    return;
  }

  auto* base = static_cast<uint8_t*>(scratch);
  auto* w16 = reinterpret_cast<uint16_t*>(base);
  auto* x16 = reinterpret_cast<__half*>(base + round_up(static_cast<size_t>(rows) * static_cast<size_t>(cols) * 2));
  const void* a = w;
  if (wt != weight_type::f16) {
    dequantize_f16(wt, w, rows * cols, w16, s_);
    a = w16;
  }
  const int64_t nx_elems = n_x * cols;
  const int64_t grid = std::min<int64_t>((nx_elems + k_threads - 1) / k_threads, int64_t{1} << 20);
  to_f16_kernel<<<static_cast<unsigned>(grid), k_threads, 0, s_>>>(x, nx_elems, x16);
  check_last("gemm: activations to f16");
  check_cublas(cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m, n, k, &alpha, a, CUDA_R_16F, k, x16, CUDA_R_16F, k, &beta, y, CUDA_R_32F, m,
                            CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
               "cublasGemmEx");
}

}  // namespace tandem::kernels::cuda
