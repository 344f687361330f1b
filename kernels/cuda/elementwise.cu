// Element-wise CUDA twins of kernels/cpu/ops.cpp (RMS norm, RoPE, activations, softmax).
// Where the CPU op's arithmetic order matters for tracking llama.cpp (double sums, RoPE's
// angles), it is reproduced here; the rest differs from the CPU by float noise only.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <string>

#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"

namespace tandem::kernels::cuda {

namespace {

constexpr int k_warp = 32;

struct sum_op {
  template <class T>
  __device__ T operator()(T a, T b) const {
    return a + b;
  }
};
struct max_op {
  // fmaxf drops a NaN operand, as the CPU's `x > m ? x : m` scan does.
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};

template <class T, class Op>
__device__ T warp_reduce(T v, Op op) {
  for (int o = k_warp / 2; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Reduction over the threadIdx.x of a row; every thread gets the result. blockDim.x is a
// multiple of 32; when it is above 32, blockDim.y must be 1 (scratch holds one row's warps).
// The reduction order is fixed, so every thread gets the same bits.
template <class T, class Op>
__device__ T row_reduce(T v, Op op, T* scratch) {
  v = warp_reduce(v, op);
  if (blockDim.x == k_warp) return v;
  const int n_warps = static_cast<int>(blockDim.x) / k_warp;
  __syncthreads();  // scratch may still be read by a previous reduction of this block
  if (threadIdx.x % k_warp == 0) scratch[threadIdx.x / k_warp] = v;
  __syncthreads();
  T r = scratch[0];
  for (int w = 1; w < n_warps; ++w) r = op(r, scratch[w]);
  return r;
}

void fail(const char* op, const std::string& why) { throw std::invalid_argument(std::string(op) + ": " + why); }

unsigned grid_for(int64_t n, int threads) {
  // Grid-stride loops cover the rest; a bounded grid keeps the count in range for any n.
  return static_cast<unsigned>(std::min<int64_t>((n + threads - 1) / threads, 65536));
}

// ---- rms_norm ----

// Rows of up to k_rms_warp_max floats get one warp each (per-head q/k norms: thousands of
// short rows); longer rows (the hidden state) get a block each.
constexpr int64_t k_rms_warp_max = 256;
constexpr int k_rms_rows_per_block = 8;
// Whole rows (the hidden state, 2-8 K floats) get 1024 threads: a thread's few loads are then
// in flight together. With 256 threads, each thread's 8 dependent trips to memory made a
// 2048-wide norm take 9 us on an H200.
constexpr int k_rms_block = 1024;

__global__ void __launch_bounds__(k_rms_block) rms_norm_kernel(const float* x, const float* w, float* out, int64_t n_rows, int64_t n, float eps) {
  __shared__ double scratch[k_warp];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * blockDim.y + threadIdx.y;
  if (row >= n_rows) return;  // only in the warp-per-row layout, which never synchronises
  const float* xr = x + row * n;
  float* o = out + row * n;
  // As ops.cpp's RMS norm: squares rounded to float, summed in double.
  double ss = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float v = xr[i];
    ss += static_cast<double>(v * v);
  }
  ss = row_reduce(ss, sum_op{}, scratch);
  const float mean = static_cast<float>(ss / static_cast<double>(n));
  const float scale = 1.0f / sqrtf(mean + eps);
  // out may alias x: each element is read and then written by the same thread.
  if (w) {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) o[i] = (xr[i] * scale) * w[i];
  } else {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) o[i] = xr[i] * scale;
  }
}

// ---- rope ----

// What ops.cpp's RoPE derives from rope_params once per call, computed on the host with the same
// expressions so the device sees the same bits.
struct rope_args {
  int64_t row_stride;
  int n_heads;
  int head_dim;
  int half;  // rotated pairs per head
  bool neox;
  bool yarn;
  float theta_scale;
  float freq_scale;
  float ext_factor;
  float corr_low;
  float corr_high;
  float mscale;
};

constexpr int k_rope_block = 1024;  // as k_rms_block: one pass over a row's pairs

__global__ void __launch_bounds__(k_rope_block) rope_kernel(float* x, const int32_t* pos, const float* freq_factors, rope_args a) {
  extern __shared__ float cs[];  // [half][cos, sin]
  const int64_t row = blockIdx.x;
  const float p = static_cast<float>(pos[row]);
  for (int i = threadIdx.x; i < a.half; i += blockDim.x) {
    // theta_i by i repeated float multiplications, the sequence ops.cpp (and ggml) rounds
    // through, rather than powf: angles at large positions then match the CPU's.
    float theta = p;
    for (int j = 0; j < i; ++j) theta *= a.theta_scale;
    const float extrap = freq_factors ? theta / freq_factors[i] : theta;
    const float interp = a.freq_scale * extrap;
    float angle = interp;
    if (a.yarn) {
      const float y = (static_cast<float>(i) - a.corr_low) / fmaxf(0.001f, a.corr_high - a.corr_low);
      const float mix = (1.0f - fminf(1.0f, fmaxf(0.0f, y))) * a.ext_factor;
      // Unfused, as the CPU (built without FMA) rounds it.
      angle = __fadd_rn(__fmul_rn(interp, 1.0f - mix), __fmul_rn(extrap, mix));
    }
    cs[2 * i] = cosf(angle) * a.mscale;
    cs[2 * i + 1] = sinf(angle) * a.mscale;
  }
  __syncthreads();

  float* xr = x + row * a.row_stride;
  const int stride = a.neox ? 1 : 2;
  const int other = a.neox ? a.half : 1;
  const int total = a.n_heads * a.half;
  for (int idx = threadIdx.x; idx < total; idx += blockDim.x) {
    const int h = idx / a.half;
    const int i = idx - h * a.half;
    float* pa = xr + static_cast<int64_t>(h) * a.head_dim + i * stride;
    float* pb = pa + other;
    const float c = cs[2 * i];
    const float s = cs[2 * i + 1];
    const float x0 = *pa;
    const float x1 = *pb;
    *pa = __fsub_rn(__fmul_rn(x0, c), __fmul_rn(x1, s));
    *pb = __fadd_rn(__fmul_rn(x0, s), __fmul_rn(x1, c));
  }
}

// ops.cpp's YaRN correction dims, the same float expressions.
float yarn_corr_dim(int n_dims, int n_ctx_orig, float n_rot_turns, float base) {
  const float pi = 3.14159265358979323846f;
  return static_cast<float>(n_dims) * std::log(static_cast<float>(n_ctx_orig) / (n_rot_turns * 2.0f * pi)) / (2.0f * std::log(base));
}

// ---- swiglu, add, add_rows ----

__global__ void swiglu_kernel(float* gate, const float* up, int64_t n) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) {
    const float g = gate[i];
    // g / (1 + e^-g), not g * sigmoid(g): for very negative g, e^-g is inf and this gives -0
    // (as ops.cpp) where the product form would give inf * 0 = NaN.
    gate[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

__global__ void add_kernel(float* x, const float* y, int64_t n) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += step) x[i] += y[i];
}

__global__ void add_rows_kernel(float* x, const float* b, int64_t total, int64_t n) {
  const int64_t step = static_cast<int64_t>(gridDim.x) * blockDim.x;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < total; i += step) x[i] += b[i % n];
}

// ---- softmax ----

__global__ void softmax_kernel(float* x, int64_t n) {
  __shared__ float scratch_f[k_warp];
  __shared__ double scratch_d[k_warp];
  float* xr = x + static_cast<int64_t>(blockIdx.x) * n;
  float m = -INFINITY;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) m = fmaxf(m, xr[i]);
  m = row_reduce(m, max_op{}, scratch_f);
  // As ops.cpp's softmax: f32 exponentials, their sum in double so a vocabulary-long row keeps its
  // small terms.
  double sum = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const float e = expf(xr[i] - m);
    xr[i] = e;
    sum += e;
  }
  sum = row_reduce(sum, sum_op{}, scratch_d);
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) xr[i] *= inv;
}

}  // namespace

void rms_norm(const float* x, const float* w, float* out, int64_t n_rows, int64_t n, float eps, stream_t s) {
  if (n_rows < 0 || n < 0) fail("rms_norm", "negative size");
  if (n_rows == 0 || n == 0) return;
  if (!x || !out) fail("rms_norm", "null input or output");
  if (n <= k_rms_warp_max) {
    const int64_t blocks = (n_rows + k_rms_rows_per_block - 1) / k_rms_rows_per_block;
    if (blocks > INT32_MAX) fail("rms_norm", "too many rows");
    rms_norm_kernel<<<static_cast<unsigned>(blocks), dim3(k_warp, k_rms_rows_per_block), 0, s>>>(x, w, out, n_rows, n, eps);
  } else {
    if (n_rows > INT32_MAX) fail("rms_norm", "too many rows");
    rms_norm_kernel<<<static_cast<unsigned>(n_rows), k_rms_block, 0, s>>>(x, w, out, n_rows, n, eps);
  }
  check_last("rms_norm");
}

void rope(float* x, int64_t n_rows, int64_t row_stride, int n_heads, int head_dim, const int32_t* pos, const cpu::rope_params& p,
          const float* freq_factors, stream_t s) {
  if (n_rows < 0) fail("rope", "negative row count");
  if (n_rows == 0 || n_heads == 0) return;
  if (n_heads < 0 || head_dim <= 0) fail("rope", "bad head geometry");
  if (row_stride < static_cast<int64_t>(n_heads) * head_dim) fail("rope", "row_stride below n_heads * head_dim");
  if (!x || !pos) fail("rope", "null data or positions");
  if (n_rows > INT32_MAX) fail("rope", "too many rows");
  const int n_rot = std::min(p.n_rot > 0 ? p.n_rot : head_dim, head_dim);
  const int half = n_rot / 2;
  if (half == 0) return;
  // cos/sin of one row live in shared memory; keep them inside the default 48 KiB.
  if (half > 4096) fail("rope", "more than 8192 rotated dims");

  rope_args a{};
  a.row_stride = row_stride;
  a.n_heads = n_heads;
  a.head_dim = head_dim;
  a.half = half;
  a.neox = p.pairing == cpu::rope_pairing::neox;
  a.yarn = p.ext_factor != 0.0f;
  a.theta_scale = std::pow(p.freq_base, -2.0f / static_cast<float>(n_rot));
  a.freq_scale = p.freq_scale;
  a.ext_factor = p.ext_factor;
  a.mscale = p.attn_factor;
  if (a.yarn) {
    const float start = std::floor(yarn_corr_dim(n_rot, p.n_ctx_orig, p.beta_fast, p.freq_base));
    const float end = std::ceil(yarn_corr_dim(n_rot, p.n_ctx_orig, p.beta_slow, p.freq_base));
    a.corr_low = std::max(0.0f, start);
    a.corr_high = std::min(static_cast<float>(n_rot - 1), end);
    a.mscale *= 1.0f + 0.1f * std::log(1.0f / p.freq_scale);
  }
  const size_t smem = static_cast<size_t>(2 * half) * sizeof(float);
  rope_kernel<<<static_cast<unsigned>(n_rows), k_rope_block, smem, s>>>(x, pos, freq_factors, a);
  check_last("rope");
}

void swiglu(float* gate, const float* up, int64_t n, stream_t s) {
  if (n < 0) fail("swiglu", "negative size");
  if (n == 0) return;
  if (!gate || !up) fail("swiglu", "null input");
  swiglu_kernel<<<grid_for(n, 256), 256, 0, s>>>(gate, up, n);
  check_last("swiglu");
}

void add(float* x, const float* y, int64_t n, stream_t s) {
  if (n < 0) fail("add", "negative size");
  if (n == 0) return;
  if (!x || !y) fail("add", "null input");
  add_kernel<<<grid_for(n, 256), 256, 0, s>>>(x, y, n);
  check_last("add");
}

void add_rows(float* x, const float* b, int64_t n_rows, int64_t n, stream_t s) {
  if (n_rows < 0 || n < 0) fail("add_rows", "negative size");
  if (n_rows == 0 || n == 0) return;
  if (!x || !b) fail("add_rows", "null input");
  const int64_t total = n_rows * n;
  add_rows_kernel<<<grid_for(total, 256), 256, 0, s>>>(x, b, total, n);
  check_last("add_rows");
}

void softmax(float* x, int64_t n_rows, int64_t n, stream_t s) {
  if (n_rows < 0 || n < 0) fail("softmax", "negative size");
  if (n_rows == 0 || n == 0) return;
  if (!x) fail("softmax", "null input");
  if (n_rows > INT32_MAX) fail("softmax", "too many rows");
  // One block per row, sized so short rows (attention-like) do not idle a big block and long
  // rows (a vocabulary) get enough threads in flight.
  const int threads = n <= 32 ? 32 : n <= 1024 ? 128 : n <= 8192 ? 256 : 1024;
  softmax_kernel<<<static_cast<unsigned>(n_rows), threads, 0, s>>>(x, n);
  check_last("softmax");
}

}  // namespace tandem::kernels::cuda
