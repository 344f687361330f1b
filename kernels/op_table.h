// Which (op, weight type) pairs each device's kernels implement: the one table both the CPU
// and the CUDA paths are dispatched through, so an unsupported pair is refused with the same
// message (listing what is supported) wherever it is asked for.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "kernels/weight_type.h"

namespace tandem::kernels {

enum class device_kind : uint8_t { cpu, cuda };

enum class op : uint8_t {
  matvec,      // decode: quantized weights × a few activation rows
  matmul,      // prefill / batches: weights × many activation rows
  dequantize,  // weights to a float type (CUDA: f16 for cuBLAS; CPU: f32 rows)
  get_rows,    // embedding gather
  rms_norm,
  rope,
  swiglu,
  add,
  softmax,
  kv_store,   // activations into the (paged) KV cache
  attention,  // causal GQA over the (paged) KV cache, decode and prefill
  argmax,
  top_k,
};

// Ops that take a weight type (the others work on f32 activations only).
bool op_takes_weights(op o);

struct op_entry {
  device_kind device;
  op o;
  const weight_type* types;  // the weight types it takes; none (n_types 0) for ops without weights
  size_t n_types;
};

// Every entry, CPU first; tests walk it to cover each pair. (C++17: the CUDA sources include
// this header, and nvcc builds them as C++17.)
const op_entry* op_table(size_t* n_entries);

std::string_view name(device_kind d);
std::string_view name(op o);

// Whether the device implements the op (for ops without weights, `t` is ignored).
bool supports(device_kind d, op o, weight_type t = weight_type::f32);
// The same, throwing std::invalid_argument "cuda matvec has no kernel for Q2_K (supported:
// F32, F16, ...)" when not. `what` (a tensor name, say) is prefixed when given.
void require(device_kind d, op o, weight_type t, std::string_view what = {});

}  // namespace tandem::kernels
