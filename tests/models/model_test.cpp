#include "models/model.h"

#include <doctest/doctest.h>

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "kernels/cpu/quants.h"
#include "models/gguf_writer.h"
#include "tests/test_support.h"

using namespace tandem;
using kernels::weight_type;
using models::gguf_out_value;
using models::gguf_writer;

namespace {

// Deterministic element values, exactly representable in F16 and BF16 (multiples of 1/8 in
// [-1, 1)), different per tensor so a view bound to the wrong tensor shows.
float value_of(size_t tensor_index, int64_t i) {
  return static_cast<float>((i + static_cast<int64_t>(tensor_index) * 5) % 16 - 8) * 0.125f;
}

// A small valid llama GGUF. Tensors are F32 unless `types` says otherwise; types that
// quantize_row cannot write (e.g. Q2_K) get zero bytes of the right size.
struct tiny_model {
  std::string arch = "llama";
  int64_t n_embd = 32, n_layer = 2, n_head = 4, n_head_kv = 2, n_ff = 64, n_vocab = 40;
  bool tied = false;
  bool qkv_bias = false;
  bool qk_norm = false;
  bool rope_freqs = false;
  std::map<std::string, weight_type> types;
  std::vector<std::string> names;  // in the order written; index = value_of's tensor_index

  void write(const std::string& path) {
    gguf_writer w;
    const std::string p = arch + ".";
    w.set("general.architecture", gguf_out_value::string(arch));
    w.set(p + "context_length", gguf_out_value::u32(64));
    w.set(p + "embedding_length", gguf_out_value::u32(static_cast<uint32_t>(n_embd)));
    w.set(p + "feed_forward_length", gguf_out_value::u32(static_cast<uint32_t>(n_ff)));
    w.set(p + "attention.head_count", gguf_out_value::u32(static_cast<uint32_t>(n_head)));
    w.set(p + "attention.head_count_kv", gguf_out_value::u32(static_cast<uint32_t>(n_head_kv)));
    w.set(p + "block_count", gguf_out_value::u32(static_cast<uint32_t>(n_layer)));
    names.clear();
    auto tensor = [&](const std::string& name, std::vector<int64_t> ne) {
      const auto it = types.find(name);
      const weight_type t = it == types.end() ? weight_type::f32 : it->second;
      int64_t n = 1;
      for (auto d : ne) n *= d;
      std::vector<std::byte> data(static_cast<size_t>(n / ne[0] * kernels::row_bytes(t, ne[0])));
      if (t == weight_type::f32 || t == weight_type::f16 || t == weight_type::bf16 || t == weight_type::q8_0) {
        std::vector<float> v(static_cast<size_t>(n));
        for (int64_t i = 0; i < n; ++i) v[i] = value_of(names.size(), i);
        kernels::cpu::quantize_row(t, v.data(), data.data(), n);
      }
      names.push_back(name);
      w.add_tensor(name, std::move(ne), t, std::move(data));
    };
    const int64_t hd = n_embd / n_head, q_dim = n_head * hd, kv_dim = n_head_kv * hd;
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
    w.write(path);
  }

  // The values written for `name` (n of them).
  std::vector<float> values(const std::string& name, int64_t n) const {
    size_t index = 0;
    while (index < names.size() && names[index] != name) ++index;
    REQUIRE(index < names.size());
    std::vector<float> v(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) v[i] = value_of(index, i);
    return v;
  }
};

std::vector<float> floats(const float* p, int64_t n) { return p ? std::vector<float>(p, p + n) : std::vector<float>{}; }

std::vector<float> file_floats(const models::gguf_file& f, const std::string& name) {
  const auto& t = f.tensor(name);
  REQUIRE(t.type == weight_type::f32);
  std::vector<float> v(static_cast<size_t>(t.elements()));
  std::memcpy(v.data(), t.data.data(), t.bytes);
  return v;
}

// The view must be the file's tensor itself (no copy), with rows = ne[1], cols = ne[0].
void check_view(const models::model& m, const models::weight_view& v, const std::string& name, int64_t rows, int64_t cols) {
  CAPTURE(name);
  const auto& t = m.file().tensor(name);
  CHECK(v.data == t.data.data());
  CHECK(v.type == t.type);
  CHECK(v.rows == rows);
  CHECK(v.cols == cols);
}

std::string model_error(const std::string& path) {
  try {
    models::model m(path);
  } catch (const std::runtime_error& e) {
    return e.what();
  }
  FAIL_CHECK("loading " << path << " did not throw");
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_SUITE("model") {
  TEST_CASE("binds stories260K") {
    const models::model m(test::data_path("stories260K.gguf").string());
    const auto& c = m.config();
    const auto& w = m.weights();
    CHECK(c.n_layer == 5);
    CHECK_FALSE(c.tied_embeddings);
    REQUIRE(w.layers.size() == 5);

    check_view(m, w.token_embd, "token_embd.weight", 512, 64);
    check_view(m, w.output, "output.weight", 512, 64);
    CHECK(w.output.data != w.token_embd.data);
    CHECK(floats(w.output_norm, 64) == file_floats(m.file(), "output_norm.weight"));
    CHECK(w.rope_freqs == nullptr);
    for (int l = 0; l < 5; ++l) {
      CAPTURE(l);
      const std::string b = "blk." + std::to_string(l) + ".";
      const auto& L = w.layers[l];
      check_view(m, L.wq, b + "attn_q.weight", 64, 64);
      check_view(m, L.wk, b + "attn_k.weight", 32, 64);
      check_view(m, L.wv, b + "attn_v.weight", 32, 64);
      check_view(m, L.wo, b + "attn_output.weight", 64, 64);
      check_view(m, L.w_gate, b + "ffn_gate.weight", 172, 64);
      check_view(m, L.w_up, b + "ffn_up.weight", 172, 64);
      check_view(m, L.w_down, b + "ffn_down.weight", 64, 172);
      CHECK(floats(L.attn_norm, 64) == file_floats(m.file(), b + "attn_norm.weight"));
      CHECK(floats(L.ffn_norm, 64) == file_floats(m.file(), b + "ffn_norm.weight"));
      CHECK(L.bq == nullptr);
      CHECK(L.bk == nullptr);
      CHECK(L.bv == nullptr);
      CHECK(L.q_norm == nullptr);
      CHECK(L.k_norm == nullptr);
    }

    // All F32: embeddings + output + output_norm + per layer (q, o: 64x64; k, v: 32x64;
    // two norms; gate, up, down: 172x64), 4 bytes each.
    const uint64_t per_layer = 2 * 64 * 64 + 2 * 32 * 64 + 2 * 64 + 3 * 172 * 64;
    const uint64_t elements = 2 * 512 * 64 + 64 + 5 * per_layer;
    CHECK(m.weight_bytes() == 4 * elements);
    uint64_t sum = 0;
    for (const auto& t : m.file().tensors()) sum += t.bytes;
    CHECK(m.weight_bytes() == sum);
  }

  TEST_CASE("quantized stories260K keeps its matrices quantized and sums their sizes") {
    const models::model m(test::data_path("stories260K-q8_0.gguf").string());
    uint64_t sum = 0;
    bool any_quantized = false;
    for (const auto& t : m.file().tensors()) {
      int64_t rows = 1;
      for (size_t d = 1; d < t.ne.size(); ++d) rows *= t.ne[d];
      sum += static_cast<uint64_t>(rows * kernels::row_bytes(t.type, t.ne[0]));
      any_quantized = any_quantized || t.type == weight_type::q8_0;
    }
    CHECK(any_quantized);
    CHECK(m.weight_bytes() == sum);
    CHECK(m.weight_bytes() < m.file().file_size());
    check_view(m, m.weights().layers[2].w_down, "blk.2.ffn_down.weight", 64, 172);
  }

  TEST_CASE("a tiny F32 model: views, values and tied embeddings") {
    test::scratch_dir dir;
    tiny_model t;
    SUBCASE("untied") {
      t.write((dir / "m.gguf").string());
      const models::model m((dir / "m.gguf").string());
      check_view(m, m.weights().output, "output.weight", 40, 32);
      check_view(m, m.weights().layers[1].wk, "blk.1.attn_k.weight", 16, 32);
      CHECK(floats(m.weights().layers[1].ffn_norm, 32) == t.values("blk.1.ffn_norm.weight", 32));
    }
    SUBCASE("tied: the output is the token embedding") {
      t.tied = true;
      t.write((dir / "m.gguf").string());
      const models::model m((dir / "m.gguf").string());
      CHECK(m.config().tied_embeddings);
      check_view(m, m.weights().token_embd, "token_embd.weight", 40, 32);
      CHECK(m.weights().output.data == m.weights().token_embd.data);
      CHECK(m.weights().output.rows == 40);
      CHECK(m.weights().output.cols == 32);
    }
    SUBCASE("rope_freqs are bound") {
      t.rope_freqs = true;
      t.write((dir / "m.gguf").string());
      const models::model m((dir / "m.gguf").string());
      REQUIRE(m.weights().rope_freqs != nullptr);
      CHECK(floats(m.weights().rope_freqs, 4) == t.values("rope_freqs.weight", 4));
    }
  }

  TEST_CASE("a matrix of a type tandem cannot compute names the tensor and the supported types") {
    // Q2_K blocks span 256 elements, so the width is 256; the bytes are zero, never read.
    test::scratch_dir dir;
    tiny_model t;
    t.n_embd = 256;
    t.n_head = 4;
    t.types["blk.0.attn_q.weight"] = weight_type::q2_k;
    t.write((dir / "q2k.gguf").string());
    const auto msg = model_error((dir / "q2k.gguf").string());
    CHECK(contains(msg, (dir / "q2k.gguf").string()));
    CHECK(contains(msg, "'blk.0.attn_q.weight'"));
    CHECK(contains(msg, "Q2_K"));
    const auto list_at = msg.find("supported: ");
    REQUIRE(list_at != std::string::npos);
    const auto list = msg.substr(list_at);
    for (const char* supported : {"F32", "F16", "BF16", "Q4_0", "Q8_0", "Q4_K", "Q6_K"}) CHECK(contains(list, supported));
    CHECK_FALSE(contains(list, "Q2_K"));
    CHECK_FALSE(contains(list, "IQ4_XS"));
  }

  TEST_CASE("matrices in computable types stay in the mapping") {
    test::scratch_dir dir;
    tiny_model t;
    t.types["blk.0.attn_q.weight"] = weight_type::f16;
    t.types["blk.1.ffn_up.weight"] = weight_type::q8_0;
    t.types["token_embd.weight"] = weight_type::bf16;
    t.write((dir / "m.gguf").string());
    const models::model m((dir / "m.gguf").string());
    check_view(m, m.weights().layers[0].wq, "blk.0.attn_q.weight", 32, 32);
    CHECK(m.weights().layers[0].wq.type == weight_type::f16);
    check_view(m, m.weights().layers[1].w_up, "blk.1.ffn_up.weight", 64, 32);
    CHECK(m.weights().layers[1].w_up.type == weight_type::q8_0);
    check_view(m, m.weights().token_embd, "token_embd.weight", 40, 32);
    CHECK(m.weights().token_embd.type == weight_type::bf16);
  }

  TEST_CASE("1-D tensors are converted to F32") {
    test::scratch_dir dir;
    tiny_model t;
    SUBCASE("llama norms in F16 and BF16") {
      t.types["output_norm.weight"] = weight_type::f16;
      t.types["blk.0.attn_norm.weight"] = weight_type::f16;
      t.types["blk.1.ffn_norm.weight"] = weight_type::bf16;
      t.rope_freqs = true;
      t.write((dir / "m.gguf").string());
      const models::model m((dir / "m.gguf").string());
      const auto& w = m.weights();
      CHECK(floats(w.output_norm, 32) == t.values("output_norm.weight", 32));
      CHECK(floats(w.layers[0].attn_norm, 32) == t.values("blk.0.attn_norm.weight", 32));
      CHECK(floats(w.layers[1].ffn_norm, 32) == t.values("blk.1.ffn_norm.weight", 32));
      CHECK(floats(w.layers[0].ffn_norm, 32) == t.values("blk.0.ffn_norm.weight", 32));  // F32 as is
    }
    SUBCASE("qwen2 biases in F16") {
      t.arch = "qwen2";
      t.qkv_bias = true;
      t.types["blk.1.attn_q.bias"] = weight_type::f16;
      t.types["blk.1.attn_k.bias"] = weight_type::f16;
      t.write((dir / "m.gguf").string());
      const models::model m((dir / "m.gguf").string());
      const auto& L = m.weights().layers[1];
      CHECK(floats(L.bq, 32) == t.values("blk.1.attn_q.bias", 32));
      CHECK(floats(L.bk, 16) == t.values("blk.1.attn_k.bias", 16));
      CHECK(floats(L.bv, 16) == t.values("blk.1.attn_v.bias", 16));
      CHECK(L.q_norm == nullptr);
    }
    SUBCASE("qwen3 q/k norms in F16") {
      t.arch = "qwen3";
      t.qk_norm = true;
      t.types["blk.0.attn_q_norm.weight"] = weight_type::f16;
      t.write((dir / "m.gguf").string());
      const models::model m((dir / "m.gguf").string());
      const auto& L = m.weights().layers[0];
      CHECK(floats(L.q_norm, 8) == t.values("blk.0.attn_q_norm.weight", 8));
      CHECK(floats(L.k_norm, 8) == t.values("blk.0.attn_k_norm.weight", 8));
      CHECK(L.bq == nullptr);
    }
    SUBCASE("a 1-D tensor of a type that cannot be converted is named") {
      t.types["blk.1.attn_norm.weight"] = weight_type::i32;
      t.write((dir / "m.gguf").string());
      const auto msg = model_error((dir / "m.gguf").string());
      CHECK(contains(msg, "'blk.1.attn_norm.weight'"));
      CHECK(contains(msg, "I32"));
    }
  }

  TEST_CASE("a missing file is an error naming the path") {
    test::scratch_dir dir;
    const auto p = (dir / "absent.gguf").string();
    CHECK(contains(model_error(p), p));
  }
}
