// Weight × activation products for every computable weight type, split over a thread pool.
#pragma once

#include <cstdint>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/ops.h"
#include "kernels/cpu/packed.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/weight_type.h"

namespace tandem::kernels::cpu {

// y[r * rows + o] = sum_i W[o, i] * x[r * cols + i]   for r < n_x, o < rows.
// W: `rows` rows of `cols` elements of type `wt`, each row row_bytes(wt, cols) bytes,
// contiguous (a GGUF tensor with ne = {cols, rows}). x: n_x activation rows of `cols` floats.
// Activations are converted as ggml does for the weight type (Q8_0 blocks for Q4_0/Q5_0/Q8_0,
// Q8_1 for Q4_1/Q5_1, Q8_K for K-quants, F16/BF16 for F16/BF16 weights, F32 for F32), so
// results match llama.cpp's CPU path to float rounding. n_x == 1 is the decode matvec; larger
// n_x reads each weight block once per group of activation rows (prefill).
// pool may be null (runs on the calling thread); small products run on the calling thread
// anyway, since waking workers would cost more than the work.
// w needs no particular alignment; x and y are float arrays.
// Throws std::invalid_argument (naming the type) when wt has no kernels or cols is not a
// multiple of its block size. Activation scratch is a buffer of the calling thread's that
// grows to the largest call seen (for 2-16 rows on a pool, one converted copy per pool
// thread) and is reused, so steady-state calls do not allocate.
// layout: weight_layout::packed when w holds pack_weights' panels instead of GGUF rows
// (packed.h; results as the packed kernels round them). order: packed Q4_1/Q5_1 float order on
// the AVX-512 and AVX2 paths (packed.h, sum_order; the portable reference kernel has one order).
void matmul(weight_type wt, const void* w, int64_t rows, int64_t cols, const float* x, int64_t n_x, float* y, thread_pool* pool,
            weight_layout layout = weight_layout::rows, sum_order order = sum_order::ggml);

// One weight matrix of a matmul_many call: `rows` rows of type wt at w; output y as in matmul.
struct matmul_job {
  weight_type wt;
  const void* w;
  int64_t rows;
  float* y;
  weight_layout layout = weight_layout::rows;
  sum_order order = sum_order::ggml;  // packed Q4_1/Q5_1 on the AVX-512 and AVX2 paths (packed.h)
};
inline constexpr int k_max_matmul_jobs = 4;

// Several matmuls of the same input x (n_x rows of `cols` floats) in one pass over the pool:
// the Q, K and V projections, or the gate and up projections, of a layer. x is converted once
// per distinct activation type and the workers split the row groups of all jobs together, so
// the pool synchronises once instead of once per matrix and small matrices (K, V with GQA) do
// not leave a core idle. Results equal separate matmul calls bit for bit. At most
// k_max_matmul_jobs jobs; throws std::invalid_argument as matmul does (naming the job) or for
// too many jobs.
void matmul_many(const matmul_job* jobs, int n_jobs, int64_t cols, const float* x, int64_t n_x, thread_pool* pool);

// Which e^x the SwiGLU of matmul_swiglu uses: expf, as swiglu (ops.h) and llama.cpp, or the
// vector one of swiglu_fast.
enum class swiglu_exp { expf, vector };

// The gate and up projections of x and their SwiGLU in one pass over the pool: gate.y receives
// silu(gate · x) * (up · x), up.y holds up · x. Each pool chunk computes the same rows of both
// products and applies the activation to them while they are in cache, so the activation takes
// no pass of its own and is split over the cores. Results equal matmul_many of the two jobs
// followed by swiglu (exp: expf) or swiglu_fast (vector) bit for bit. Throws
// std::invalid_argument as matmul_many does, or when gate and up differ in rows.
void matmul_swiglu(const matmul_job& gate, const matmul_job& up, int64_t cols, const float* x, int64_t n_x, thread_pool* pool, swiglu_exp exp);

// Team parts (team_part, ops.h) of the products: member `index` of `count` computes a fixed
// share of the rows on its own thread, converting the activations itself into buffers of its
// own. The parts of all members together write exactly what the whole call writes, bit for
// bit, and no two write the same output element.
// Rows [begin, end) of the first job's output that a part wrote (every activation row).
struct row_span {
  int64_t begin = 0;
  int64_t end = 0;
};

// matmul_many, one member's part; rows of jobs[0] it wrote. Throws as matmul_many does.
row_span matmul_many_part(const matmul_job* jobs, int n_jobs, int64_t cols, const float* x, int64_t n_x, team_part part);
// matmul_swiglu, one member's part: the same rows of gate and up, and their SwiGLU.
row_span matmul_swiglu_part(const matmul_job& gate, const matmul_job& up, int64_t cols, const float* x, int64_t n_x, team_part part, swiglu_exp exp);

// The smallest share of a matmul_many call a pool chunk takes, in row groups of group_rows
// rows (k_panel_rows on the packed and panel paths, k_max_weight_rows on the row kernels):
// about a fixed number of multiply-adds. A call of fewer than twice this many groups runs on
// the calling thread.
int64_t matmul_chunk_groups(int64_t cols, int64_t n_x, int64_t group_rows);

}  // namespace tandem::kernels::cpu
