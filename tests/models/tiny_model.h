// A tiny, valid Llama-family GGUF for tests that need a real model file with one thing
// changed: a key left out, a tensor of another shape or type, qwen extras. Shared by
// model_config_test (metadata and shape checks) and model_test (weight binding).
#pragma once

#include <doctest/doctest.h>

#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "kernels/cpu/quants.h"
#include "kernels/weight_type.h"
#include "models/gguf_writer.h"

namespace tandem::test {

// Deterministic element values, exactly representable in F16 and BF16 (multiples of 1/8 in
// [-1, 1)), different per tensor so a view bound to the wrong tensor shows.
inline float tiny_value(size_t tensor_index, int64_t i) { return static_cast<float>((i + static_cast<int64_t>(tensor_index) * 5) % 16 - 8) * 0.125f; }

// Tensors are F32 unless `types` says otherwise. Types quantize_row can write (F32, F16, BF16,
// Q8_0) hold value(name, index in tensors(), i): tiny_value, except rope_freqs (positive
// divisors, as a valid file has) and tensors given in `data`; the others (e.g. Q2_K, I32) get
// zero bytes of the right size, for tests that only check such a tensor is refused.
struct tiny_model {
  std::string arch = "llama";
  int64_t n_embd = 16, n_layer = 2, n_head = 4, n_head_kv = 2, n_ff = 24, n_vocab = 32, n_ctx = 64;
  int64_t key_length = 0;                               // > 0: written as attention.key_length (head_dim != n_embd / n_head)
  bool tied = false;                                    // no output.weight
  bool qkv_bias = false;                                // attn_{q,k,v}.bias in every layer (qwen2)
  bool qk_norm = false;                                 // attn_{q,k}_norm.weight in every layer (qwen3)
  bool rope_freqs = false;                              // rope_freqs.weight, one divisor per rotated pair (Llama 3)
  std::set<std::string> omit;                           // keys or tensors left out
  std::map<std::string, std::vector<int64_t>> reshape;  // tensor name -> ne written instead
  std::map<std::string, kernels::weight_type> types;    // tensor name -> type written instead
  std::map<std::string, std::vector<float>> data;       // tensor name -> all its values instead

  struct tensor_spec {
    std::string name;
    std::vector<int64_t> ne;
    kernels::weight_type type;
  };

  int64_t head_dim() const { return key_length > 0 ? key_length : n_embd / n_head; }

  // Element i of tensor `name`, the index-th tensor written.
  float value(const std::string& name, size_t index, int64_t i) const {
    if (auto it = data.find(name); it != data.end()) {
      REQUIRE_MESSAGE(static_cast<size_t>(i) < it->second.size(), "tiny_model::data['" << name << "'] is too short");
      return it->second[static_cast<size_t>(i)];
    }
    // Divisors in [1, 1.875], multiples of 1/8 (exact in F16 and BF16).
    if (name == "rope_freqs.weight") return 1.0f + static_cast<float>((i + static_cast<int64_t>(index)) % 8) * 0.125f;
    return tiny_value(index, i);
  }

  // The tensors written, in file order, with omit, reshape and types applied.
  std::vector<tensor_spec> tensors() const {
    std::vector<tensor_spec> out;
    auto tensor = [&](const std::string& name, std::vector<int64_t> ne) {
      if (omit.count(name)) return;
      if (auto it = reshape.find(name); it != reshape.end()) ne = it->second;
      const auto t = types.find(name);
      out.push_back({name, std::move(ne), t == types.end() ? kernels::weight_type::f32 : t->second});
    };
    const int64_t hd = head_dim(), q_dim = n_head * hd, kv_dim = n_head_kv * hd;
    tensor("token_embd.weight", {n_embd, n_vocab});
    tensor("output_norm.weight", {n_embd});
    if (!tied) tensor("output.weight", {n_embd, n_vocab});
    if (rope_freqs) tensor("rope_freqs.weight", {hd / 2});
    for (int64_t l = 0; l < n_layer; ++l) {
      const std::string b = "blk." + std::to_string(l) + ".";
      tensor(b + "attn_norm.weight", {n_embd});
      tensor(b + "attn_q.weight", {n_embd, q_dim});
      tensor(b + "attn_k.weight", {n_embd, kv_dim});
      tensor(b + "attn_v.weight", {n_embd, kv_dim});
      tensor(b + "attn_output.weight", {q_dim, n_embd});
      if (qkv_bias) {
        tensor(b + "attn_q.bias", {q_dim});
        tensor(b + "attn_k.bias", {kv_dim});
        tensor(b + "attn_v.bias", {kv_dim});
      }
      if (qk_norm) {
        tensor(b + "attn_q_norm.weight", {hd});
        tensor(b + "attn_k_norm.weight", {hd});
      }
      tensor(b + "ffn_norm.weight", {n_embd});
      tensor(b + "ffn_gate.weight", {n_embd, n_ff});
      tensor(b + "ffn_up.weight", {n_embd, n_ff});
      tensor(b + "ffn_down.weight", {n_ff, n_embd});
    }
    return out;
  }

  // The whole file, not yet written: tests may still set() keys or add_tensor() on it.
  models::gguf_writer writer() const {
    using models::gguf_out_value;
    models::gguf_writer w;
    const std::string p = arch + ".";
    auto key = [&](const std::string& k, gguf_out_value v) {
      if (!omit.count(k)) w.set(k, std::move(v));
    };
    auto u32 = [](int64_t v) { return gguf_out_value::u32(static_cast<uint32_t>(v)); };
    key("general.architecture", gguf_out_value::string(arch));
    key("general.name", gguf_out_value::string("tiny"));
    key(p + "context_length", u32(n_ctx));
    key(p + "embedding_length", u32(n_embd));
    key(p + "feed_forward_length", u32(n_ff));
    key(p + "attention.head_count", u32(n_head));
    key(p + "attention.head_count_kv", u32(n_head_kv));
    key(p + "block_count", u32(n_layer));
    key(p + "attention.layer_norm_rms_epsilon", gguf_out_value::f32(1e-6f));
    if (key_length > 0) key(p + "attention.key_length", u32(key_length));

    const auto specs = tensors();
    for (size_t index = 0; index < specs.size(); ++index) {
      const auto& [name, ne, t] = specs[index];
      int64_t n = 1;
      for (auto d : ne) n *= d;
      std::vector<std::byte> data(static_cast<size_t>(n / ne[0] * kernels::row_bytes(t, ne[0])));
      using kernels::weight_type;
      if (t == weight_type::f32 || t == weight_type::f16 || t == weight_type::bf16 || t == weight_type::q8_0) {
        std::vector<float> v(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = value(name, index, i);
        kernels::cpu::quantize_row(t, v.data(), data.data(), n);
      }
      w.add_tensor(name, ne, t, std::move(data));
    }
    return w;
  }

  void write(const std::string& path) const { writer().write(path); }

  // The values written for tensor `name` (all its elements, before any conversion).
  std::vector<float> values(const std::string& name) const {
    const auto specs = tensors();
    size_t index = 0;
    while (index < specs.size() && specs[index].name != name) ++index;
    REQUIRE_MESSAGE(index < specs.size(), "tiny_model writes no tensor '" << name << "'");
    int64_t n = 1;
    for (auto d : specs[index].ne) n *= d;
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = value(name, index, i);
    return v;
  }
};

}  // namespace tandem::test
