// Hyper-parameters of a Llama-family model, read and validated from GGUF metadata.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "kernels/cpu/ops.h"
#include "models/gguf_reader.h"

namespace tandem::models {

// Largest context length tandem accepts anywhere (a file's context_length, a context size
// asked for): as llama.cpp's largest trained contexts. The one definition of this limit.
inline constexpr int64_t k_max_context = int64_t{1} << 24;

// Architectures tandem runs. mistral, codellama, deepseek-coder v1 and tinyllama are stored
// as "llama" by llama.cpp's converter and need nothing extra.
enum class architecture { llama, qwen2, qwen3 };
std::string_view architecture_name(architecture a);
// "llama, qwen2, qwen3": for error messages.
std::string supported_architectures();

enum class rope_scaling_type { none, linear, yarn };

struct model_config {
  architecture arch = architecture::llama;
  std::string name;  // general.name, may be empty
  int64_t n_vocab = 0;
  int64_t n_embd = 0;  // model width
  int64_t n_layer = 0;
  int64_t n_head = 0;
  int64_t n_head_kv = 0;    // grouped-query attention: n_head % n_head_kv == 0
  int64_t head_dim = 0;     // key_length (may differ from n_embd / n_head, e.g. qwen3)
  int64_t n_ff = 0;         // feed-forward width
  int64_t n_ctx_train = 0;  // context length the model was trained with
  float rms_eps = 1e-5f;

  // RoPE
  int n_rot = 0;  // dimensions rotated per head
  float rope_base = 10000.0f;
  kernels::cpu::rope_pairing rope_pairing = kernels::cpu::rope_pairing::adjacent;
  rope_scaling_type rope_scaling = rope_scaling_type::none;
  float rope_scale_factor = 1.0f;  // context extension factor (linear, yarn)
  int64_t rope_orig_ctx = 0;       // yarn: original context length
  float yarn_attn_factor = 1.0f;
  float yarn_beta_fast = 32.0f;
  float yarn_beta_slow = 1.0f;
  bool has_rope_freqs = false;  // llama3-style per-dimension divisors in rope_freqs.weight

  bool tied_embeddings = false;  // output.weight absent: logits use token_embd.weight
  bool qkv_bias = false;         // qwen2
  bool qk_norm = false;          // qwen3: per-head RMSNorm of q and k before RoPE

  int64_t q_dim() const { return n_head * head_dim; }
  int64_t kv_dim() const { return n_head_kv * head_dim; }
};

// Reads the architecture's keys and checks them against each other and against the tensor
// shapes. Throws gguf_error naming the file and the key (or tensor) on any inconsistency; an
// unknown architecture is an error listing the supported ones. Sizes are capped well above
// real models (head_dim <= 1024, q_dim <= 2^17, n_ff <= 2^18, n_embd <= 2^17) so a hostile
// header cannot ask for absurd scratch buffers. Tensor types and values are checked when the
// weights are bound (model.cpp), not here.
model_config read_model_config(const gguf_file& f);

}  // namespace tandem::models
