// Internal to models/cuda/: the device memory of a gpu_forward (gpu_forward.cpp sizes and
// carves it, cuda_pass.cpp runs a recipe's ops over it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/cuda/ops.h"
#include "kernels/cuda/runtime.h"

namespace tandem::models {

namespace cu = kernels::cuda;

// A piece of the pass's scratch arena (gpu_forward carves every buffer below from one
// allocation: the arbiter's device tier under an engine, else one cudaMalloc).
struct device_span {
  void* p = nullptr;
  size_t n = 0;
  void* get() const { return p; }
  template <class T>
  T* as() const {
    return static_cast<T*>(p);
  }
  size_t size() const { return n; }
};

// Device memory of the pass: everything is sized at construction, so eval and decode only
// enqueue kernels and copies.
struct gpu_device_state {
  explicit gpu_device_state(cu::stream_t s) : gemm(s) {}
  cu::gemm gemm;
  cu::device_buffer weights;  // resident mode: every segment, at seg_offset
  std::vector<size_t> seg_offset;
  cu::device_buffer kv;                    // n_seq * blocks_per_seq blocks
  cu::device_buffer arena;                 // the spans below, when no arbiter provides them
  device_span tables;                      // int32 block ids, blocks_per_seq per sequence
  device_span rel_ids, pos, table_of_row;  // int32 per row
  device_span act;                         // x, xb, q, k, v, attn, gate, up (max_rows each)
  device_span logits, head;                // [out rows][n_vocab], [out rows][largest head piece]
  device_span gemm_scratch;
  device_span cublas_workspace;  // gemm::k_workspace_bytes when the pass can take cuBLAS
  device_span freq_factors;
  cu::graph graphs[cu::k_matvec_max_rows + 1];  // by rows of the pass (gpu_forward::run)
  std::vector<const std::byte*> graph_bases;    // the segments' addresses the graphs were captured over
  cu::event layer_done[2];                      // after the kernels of layers l and l-1 (streaming)
  float *x = nullptr, *xb = nullptr, *q = nullptr, *k = nullptr, *v = nullptr, *attn = nullptr, *gate = nullptr, *up = nullptr;
  size_t block_bytes = 0, part_bytes = 0;  // a KV block; one layer's K (or V) rows in it
  size_t block_stride = 0;                 // bytes from one block id to the next (kv_pool::block_stride)
  // Pinned staging of the per-row arrays, so their copies overlap: positions and table
  // offsets, then one array of relative ids per embedding piece (a piece's ids must not be
  // rewritten while an earlier piece's copy is still queued). Every pass ends synchronised,
  // so the next one may rewrite them all.
  cu::pinned_buffer staging;
  cu::pinned_buffer h_tables;  // int32, blocks_per_seq per sequence
  int32_t *h_pos = nullptr, *h_tor = nullptr, *h_rel = nullptr;
};

}  // namespace tandem::models
