// Puts one model under device and host budgets for a single-model run (`tandem run --vram`,
// `--gpu`):
// a backend, an arbiter with those budgets, the KV cache as a paged pool and the activation
// scratch on the device, the model's segments staged to host where they fit, and as many
// segments on the device as fit, the rest streamed through stream slots. (The engine of the executor
// issue places several models by the policy's plan instead.)
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "memory/arbiter.h"
#include "memory/backend.h"
#include "memory/kv_pool.h"
#include "models/arbiter_residency.h"
#include "models/forward.h"
#include "models/model.h"

namespace tandem::runtime {

struct placement_options {
  uint64_t device_bytes = 0;
  uint64_t host_bytes = 0;
  memory::backend_options backend;
  bool allow_streaming = true;  // off: the weights must all fit on the device with the KV cache
  int prefetch_depth = 2;       // segments copied ahead of the one in use when streaming
  int64_t n_ctx = 0;            // KV positions per sequence
  int64_t n_seq = 1;
  kernels::cpu::kv_type kv = kernels::cpu::kv_type::f16;
  bool kv_rotate = false;
  int64_t kv_block_tokens = 16;
  int64_t max_batch = 512;  // prompt tokens per forward pass (sizes the activation scratch)
  bool wait = false;        // wait for every copy before returning (else they land while the first pass runs)
};

// Owns what it placed; destroy before the model.
struct placed_model {
  std::unique_ptr<memory::backend> backend;
  std::unique_ptr<memory::arbiter> arbiter;
  std::unique_ptr<models::arbiter_residency> residency;
  std::unique_ptr<memory::kv_pool> kv;
  std::optional<memory::allocation> scratch;  // the forward pass's activations, device tier
  int segments = 0;
  int on_device = 0;     // segments with a device copy of their own
  int staged = 0;        // segments with a host copy
  int stream_slots = 0;  // 0 when every segment is on the device
  memory::event loaded;  // the device copies started here
  ~placed_model();
};

// Throws std::runtime_error naming the sizes when the budgets cannot hold the KV cache, the
// stream slots, or (streaming off) the whole model, and for a GPU backend (device memory the
// host cannot address) when the model was loaded packed. On a GPU no activation scratch is
// placed: the CUDA forward pass takes its own from the arbiter.
std::unique_ptr<placed_model> place_model(const models::model& m, const std::string& name, const placement_options& o);

// The context parameters of a forward pass over a placed model's KV pool.
models::context_params placed_context(const placed_model& p, const placement_options& o);

}  // namespace tandem::runtime
