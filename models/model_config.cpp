#include "models/model_config.h"

#include <cfloat>
#include <cmath>

namespace tandem::models {
namespace {

// Generous ceilings that no real model reaches (largest today: head_dim 256, q_dim 16384,
// n_ff ~59k); they keep a hostile header from asking for absurd scratch buffers before any
// tensor is touched. Scratch per prompt row is O(n_ff + q_dim + n_embd) floats.
constexpr int64_t k_max_width = 1 << 17;
constexpr int64_t k_max_layers = 1024;
constexpr int64_t k_max_heads = 1024;
constexpr int64_t k_max_head_dim = 1024;
constexpr int64_t k_max_q_dim = 1 << 17;
constexpr int64_t k_max_ff = 1 << 18;
constexpr int64_t k_max_vocab = 1 << 22;

int64_t require_int(const gguf_file& f, const std::string& key, int64_t lo, int64_t hi) {
  const auto v = f.get_int(key);
  if (!v) f.fail_key(key, "is missing");
  if (*v < lo || *v > hi) f.fail_key(key, "value " + std::to_string(*v) + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
  return *v;
}

int64_t optional_int(const gguf_file& f, const std::string& key, int64_t def, int64_t lo, int64_t hi) {
  if (!f.find(key)) return def;
  return require_int(f, key, lo, hi);
}

float optional_float(const gguf_file& f, const std::string& key, float def) {
  const auto v = f.get_float(key);
  if (!v) return def;
  if (!std::isfinite(*v)) f.fail_key(key, "is not a finite number");
  // Converting a double outside float's range to float is undefined behaviour.
  if (std::abs(*v) > static_cast<double>(FLT_MAX)) f.fail_key(key, "value " + std::to_string(*v) + " is outside the range of a float");
  return static_cast<float>(*v);
}

void check_shape(const gguf_file& f, const std::string& name, std::initializer_list<int64_t> ne) {
  const auto& t = f.tensor(name);
  const std::vector<int64_t> want(ne);
  if (t.ne != want) {
    auto fmt = [](const std::vector<int64_t>& v) {
      std::string s = "{";
      for (size_t i = 0; i < v.size(); ++i) s += (i ? ", " : "") + std::to_string(v[i]);
      return s + "}";
    };
    throw gguf_error(f.path() + ": tensor '" + name + "': shape " + fmt(t.ne) + " does not match the metadata, expected " + fmt(want));
  }
}

}  // namespace

std::string_view architecture_name(architecture a) {
  switch (a) {
    case architecture::llama:
      return "llama";
    case architecture::qwen2:
      return "qwen2";
    case architecture::qwen3:
      return "qwen3";
  }
  return "?";
}

std::string supported_architectures() { return "llama, qwen2, qwen3"; }

model_config read_model_config(const gguf_file& f) {
  model_config c;
  const auto arch = f.get_string("general.architecture");
  if (!arch) f.fail_key("general.architecture", "is missing");
  if (*arch == "llama")
    c.arch = architecture::llama;
  else if (*arch == "qwen2")
    c.arch = architecture::qwen2;
  else if (*arch == "qwen3")
    c.arch = architecture::qwen3;
  else
    f.fail_key("general.architecture", "architecture '" + *arch + "' is not supported (supported: " + supported_architectures() + ")");
  const std::string p = *arch + ".";
  c.name = f.get_string("general.name").value_or("");

  c.n_embd = require_int(f, p + "embedding_length", 1, k_max_width);
  c.n_layer = require_int(f, p + "block_count", 1, k_max_layers);
  c.n_ff = require_int(f, p + "feed_forward_length", 1, k_max_ff);
  c.n_head = require_int(f, p + "attention.head_count", 1, k_max_heads);
  c.n_head_kv = optional_int(f, p + "attention.head_count_kv", c.n_head, 1, k_max_heads);
  if (c.n_head % c.n_head_kv != 0)
    f.fail_key(p + "attention.head_count_kv", "head count " + std::to_string(c.n_head) + " is not a multiple of " + std::to_string(c.n_head_kv));
  // The head size comes from key_length, or else from embedding_length / head_count; errors
  // about it name whichever key it came from.
  const bool has_key_length = f.find(p + "attention.key_length") != nullptr;
  const std::string head_dim_key = p + (has_key_length ? "attention.key_length" : "attention.head_count");
  if (has_key_length) {
    c.head_dim = require_int(f, p + "attention.key_length", 1, k_max_head_dim);
  } else {
    if (c.n_embd % c.n_head != 0) f.fail_key(head_dim_key, "embedding length is not a multiple of the head count and key_length is absent");
    c.head_dim = c.n_embd / c.n_head;
    if (c.head_dim > k_max_head_dim)
      f.fail_key(head_dim_key, "embedding_length / head_count gives a head size of " + std::to_string(c.head_dim) + ", more than " +
                                   std::to_string(k_max_head_dim) + " (key_length is absent)");
  }
  if (c.q_dim() > k_max_q_dim)
    f.fail_key(head_dim_key, "head_count x head size = " + std::to_string(c.n_head) + " x " + std::to_string(c.head_dim) + " = " +
                                 std::to_string(c.q_dim()) + " is more than " + std::to_string(k_max_q_dim));
  const int64_t v_dim = optional_int(f, p + "attention.value_length", c.head_dim, 1, k_max_head_dim);
  if (v_dim != c.head_dim) f.fail_key(p + "attention.value_length", "differs from key_length (not supported)");
  c.n_ctx_train = optional_int(f, p + "context_length", 2048, 1, k_max_context);
  c.rms_eps = optional_float(f, p + "attention.layer_norm_rms_epsilon", 1e-5f);
  if (!(c.rms_eps > 0)) f.fail_key(p + "attention.layer_norm_rms_epsilon", "must be positive");

  if (f.find(p + "rope.dimension_count")) {
    c.n_rot = static_cast<int>(require_int(f, p + "rope.dimension_count", 2, c.head_dim));
    if (c.n_rot % 2) f.fail_key(p + "rope.dimension_count", "must be even");
  } else {
    // RoPE then rotates the whole head, which needs pairs of dimensions: the head size is at
    // fault, not the absent key.
    if (c.head_dim % 2)
      f.fail_key(head_dim_key, "head size " + std::to_string(c.head_dim) +
                                   " is odd, but RoPE rotates pairs of dimensions (rope.dimension_count is absent, so the whole head rotates)");
    c.n_rot = static_cast<int>(c.head_dim);
  }
  c.rope_base = optional_float(f, p + "rope.freq_base", c.arch == architecture::llama ? 10000.0f : 1000000.0f);
  if (!(c.rope_base > 1)) f.fail_key(p + "rope.freq_base", "must be greater than 1");
  c.rope_pairing = c.arch == architecture::llama ? kernels::cpu::rope_pairing::adjacent : kernels::cpu::rope_pairing::neox;

  const auto scaling = f.get_string(p + "rope.scaling.type").value_or("none");
  if (scaling == "none")
    c.rope_scaling = rope_scaling_type::none;
  else if (scaling == "linear")
    c.rope_scaling = rope_scaling_type::linear;
  else if (scaling == "yarn")
    c.rope_scaling = rope_scaling_type::yarn;
  else
    f.fail_key(p + "rope.scaling.type", "'" + scaling + "' is not supported (none, linear, yarn)");
  c.rope_scale_factor = optional_float(f, p + "rope.scaling.factor", 1.0f);
  if (const float legacy = optional_float(f, p + "rope.scale_linear", 0.0f); legacy > 0 && scaling == "none") {
    c.rope_scaling = rope_scaling_type::linear;  // older converters wrote only this key
    c.rope_scale_factor = legacy;
  }
  if (!(c.rope_scale_factor >= 1.0f) && c.rope_scaling != rope_scaling_type::none) f.fail_key(p + "rope.scaling.factor", "must be at least 1");
  c.rope_orig_ctx = optional_int(f, p + "rope.scaling.original_context_length", c.n_ctx_train, 1, k_max_context);
  c.yarn_attn_factor = optional_float(f, p + "rope.scaling.attn_factor", 1.0f);
  c.yarn_beta_fast = optional_float(f, p + "rope.scaling.yarn_beta_fast", 32.0f);
  c.yarn_beta_slow = optional_float(f, p + "rope.scaling.yarn_beta_slow", 1.0f);
  if (c.rope_scaling == rope_scaling_type::yarn) {
    // YaRN ramps between the dimensions that turn beta_fast and beta_slow times over the
    // original context; the ramp is only defined for beta_fast > beta_slow > 0.
    if (!(c.yarn_beta_slow > 0)) f.fail_key(p + "rope.scaling.yarn_beta_slow", "must be positive");
    if (!(c.yarn_beta_fast > c.yarn_beta_slow))
      f.fail_key(p + "rope.scaling.yarn_beta_fast",
                 "value " + std::to_string(c.yarn_beta_fast) + " must be greater than yarn_beta_slow (" + std::to_string(c.yarn_beta_slow) + ")");
    if (!(c.yarn_attn_factor > 0)) f.fail_key(p + "rope.scaling.attn_factor", "must be positive");
  }

  // Shapes: the metadata must agree with the tensors that the forward pass will index.
  const auto& emb = f.tensor("token_embd.weight");
  if (emb.ne.size() != 2)
    throw gguf_error(f.path() + ": tensor 'token_embd.weight' has " + std::to_string(emb.ne.size()) +
                     " dimensions, expected 2 (embedding_length, vocabulary size)");
  if (emb.ne[0] != c.n_embd)
    throw gguf_error(f.path() + ": tensor 'token_embd.weight': first dimension " + std::to_string(emb.ne[0]) + " must equal " + p +
                     "embedding_length (" + std::to_string(c.n_embd) + ")");
  c.n_vocab = emb.ne[1];
  if (c.n_vocab > k_max_vocab)
    throw gguf_error(f.path() + ": tensor 'token_embd.weight': vocabulary of " + std::to_string(c.n_vocab) + " is too large");
  if (const auto vs = f.get_int(p + "vocab_size"); vs && *vs != c.n_vocab)
    f.fail_key(p + "vocab_size", "is " + std::to_string(*vs) + " but token_embd.weight has " + std::to_string(c.n_vocab) + " rows");
  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  if (!c.tied_embeddings) check_shape(f, "output.weight", {c.n_embd, c.n_vocab});
  check_shape(f, "output_norm.weight", {c.n_embd});
  if (f.find_tensor("rope_freqs.weight")) {
    // Its type and values are checked where it is converted to F32 (model.cpp).
    c.has_rope_freqs = true;
    check_shape(f, "rope_freqs.weight", {c.n_rot / 2});
  }
  c.qkv_bias = f.find_tensor("blk.0.attn_q.bias") != nullptr;
  c.qk_norm = f.find_tensor("blk.0.attn_q_norm.weight") != nullptr;
  if (c.arch == architecture::qwen3 && !c.qk_norm)
    throw gguf_error(f.path() + ": tensor 'blk.0.attn_q_norm.weight' is missing (qwen3 models normalise q and k per head)");

  for (int64_t l = 0; l < c.n_layer; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    check_shape(f, b + "attn_norm.weight", {c.n_embd});
    check_shape(f, b + "attn_q.weight", {c.n_embd, c.q_dim()});
    check_shape(f, b + "attn_k.weight", {c.n_embd, c.kv_dim()});
    check_shape(f, b + "attn_v.weight", {c.n_embd, c.kv_dim()});
    check_shape(f, b + "attn_output.weight", {c.q_dim(), c.n_embd});
    check_shape(f, b + "ffn_norm.weight", {c.n_embd});
    check_shape(f, b + "ffn_gate.weight", {c.n_embd, c.n_ff});
    check_shape(f, b + "ffn_up.weight", {c.n_embd, c.n_ff});
    check_shape(f, b + "ffn_down.weight", {c.n_ff, c.n_embd});
    if (c.qkv_bias) {
      check_shape(f, b + "attn_q.bias", {c.q_dim()});
      check_shape(f, b + "attn_k.bias", {c.kv_dim()});
      check_shape(f, b + "attn_v.bias", {c.kv_dim()});
    }
    if (c.qk_norm) {
      check_shape(f, b + "attn_q_norm.weight", {c.head_dim});
      check_shape(f, b + "attn_k_norm.weight", {c.head_dim});
    }
  }
  return c;
}

}  // namespace tandem::models
