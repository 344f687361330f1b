// A model architecture written once, as calls on a backend's ops; the CPU and CUDA backends
// implement the ops (models/cpu_ops.h, models/cuda/cuda_ops.h) and the recipe does not know
// which one runs it. recipe_runner.h drives a recipe through a pass: the embedding, the layers
// with their weight leases and prefetches, the output head.
//
// Operands are the pass's activation buffers, named (act), so that each backend resolves them
// to its own memory: host scratch, a team member's private copy, device memory. Every buffer
// has one row per row of the pass.
#pragma once

#include <cstdint>
#include <initializer_list>

#include "models/model.h"

namespace tandem::models {

// The activations of a pass. Widths: x, xb n_embd; q, attn q_dim; k, v kv_dim; gate, up n_ff.
enum class act : uint8_t { x, xb, q, k, v, attn, gate, up };
inline constexpr int k_act_count = 8;

// One product of a matmul call: out = in · w^T.
struct product {
  const weight_view* w;
  act out;
};

// What a layer asks of a backend. A backend may run the calls asynchronously (the CUDA
// stream) or split them over threads (a CPU team); the results are as if each ran in order.
class layer_ops {
 public:
  virtual ~layer_ops() = default;
  // out = rms_norm(in) * w, row by row (n_embd wide).
  virtual void norm(act in, const float* w, act out) = 0;
  // Each product's out = in · w^T; the weights share the input and its width (Q, K, V).
  virtual void matmul(act in, std::initializer_list<product> products) = 0;
  // gate = silu(in · w_gate^T) * (in · w_up^T); up receives in · w_up^T.
  virtual void matmul_swiglu(act in, const weight_view& w_gate, const weight_view& w_up, act gate, act up) = 0;
  // a += b per row (b: one row of a's width).
  virtual void add_bias(act a, const float* b) = 0;
  // rms_norm of each head_dim group of a (n_heads per row) with w [head_dim], in place.
  virtual void head_norm(act a, const float* w, int64_t n_heads) = 0;
  // RoPE of n_heads heads of each row at the row's position, in place.
  virtual void rope(act a, int64_t n_heads) = 0;
  // Writes the rows of k and v into layer `layer` of each row's sequence's KV cache.
  virtual void kv_store(int64_t layer, act k, act v) = 0;
  // out = causal attention of q over layer `layer` of each row's sequence's KV cache
  // (grouped-query heads, scale 1/sqrt(head_dim)).
  virtual void attention(int64_t layer, act q, act out) = 0;
  // dst += src, element-wise (both n_embd wide).
  virtual void add(act dst, act src) = 0;
};

// One architecture: its layer, from the layer's weights (layer_weights, with the optional
// tensors an architecture has: biases, q/k norms).
struct recipe {
  const char* name;
  void (*layer)(layer_ops& o, const model_config& c, const layer_weights& w, int64_t layer);
};

// The recipe of c.arch. Every architecture model_config accepts has one.
const recipe& recipe_for(const model_config& c);

}  // namespace tandem::models
