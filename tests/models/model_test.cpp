#include "models/model.h"

#include <doctest/doctest.h>

#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/weight_type.h"
#include "models/tokenizer.h"
#include "tests/models/tiny_model.h"
#include "tests/test_support.h"

using namespace tandem;
using kernels::weight_type;

namespace {

// Wider than the shared default (head_dim 8) and with a vocabulary unlike the width, so a
// view with rows and cols swapped shows.
test::tiny_model tiny() {
  test::tiny_model t;
  t.n_embd = 32;
  t.n_ff = 64;
  t.n_vocab = 40;
  return t;
}

std::vector<float> floats(const float* p, int64_t n) { return p ? std::vector<float>(p, p + n) : std::vector<float>{}; }

std::vector<float> file_floats(const models::gguf_file& f, const std::string& name) {
  const auto& t = f.tensor(name);
  REQUIRE(t.type == weight_type::f32);
  std::vector<float> v(static_cast<size_t>(t.elements()));
  std::memcpy(v.data(), t.data.data(), t.bytes);
  return v;
}

// The view must be the file's tensor itself (no copy), with rows = ne[1], cols = ne[0] -- or,
// where the model packed it at load, packed panels holding the same rows.
void check_view(const models::model& m, const models::weight_view& v, const std::string& name, int64_t rows, int64_t cols) {
  CAPTURE(name);
  const auto& t = m.file().tensor(name);
  if (v.layout == kernels::cpu::weight_layout::packed) {
    CHECK(kernels::cpu::packable(t.type));
    std::vector<float> got(static_cast<size_t>(cols)), want(got);
    for (const int64_t r : {int64_t{0}, rows / 2, rows - 1}) {
      models::dequantize_weight_row(v, r, got.data());
      kernels::cpu::dequantize_row(t.type, t.data.data() + r * kernels::row_bytes(t.type, cols), want.data(), cols);
      CHECK(got == want);
    }
  } else {
    CHECK(v.data == t.data.data());
  }
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

  TEST_CASE("packing at load: packable matrices become panels with the same rows, or stay mapped when off") {
    const auto path = test::data_path("stories260K-q8_0.gguf").string();
    const models::model packed(path), mapped(path, {.pack_weights = false});
    const auto& t = packed.file().tensor("blk.1.attn_q.weight");
    REQUIRE(t.type == weight_type::q8_0);
    const auto& v = packed.weights().layers[1].wq;
    CHECK((v.layout == kernels::cpu::weight_layout::packed) == kernels::cpu::pack_at_load(weight_type::q8_0));
    check_view(packed, v, "blk.1.attn_q.weight", 64, 64);
    const auto& u = mapped.weights().layers[1].wq;
    CHECK(u.layout == kernels::cpu::weight_layout::rows);
    CHECK(u.data == mapped.file().tensor("blk.1.attn_q.weight").data.data());
  }

  TEST_CASE("a tiny F32 model: views, values and tied embeddings") {
    test::scratch_dir dir;
    auto t = tiny();
    SUBCASE("untied") {
      t.write((dir / "m.gguf").string());
      const models::model m((dir / "m.gguf").string());
      check_view(m, m.weights().output, "output.weight", 40, 32);
      check_view(m, m.weights().layers[1].wk, "blk.1.attn_k.weight", 16, 32);
      CHECK(floats(m.weights().layers[1].ffn_norm, 32) == t.values("blk.1.ffn_norm.weight"));
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
      CHECK(floats(m.weights().rope_freqs, 4) == t.values("rope_freqs.weight"));
    }
  }

  TEST_CASE("a matrix of a type tandem cannot compute names the tensor and the supported types") {
    // Q2_K blocks span 256 elements, so the width is 256; the bytes are zero, never read.
    test::scratch_dir dir;
    auto t = tiny();
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
    auto t = tiny();
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
    auto t = tiny();
    SUBCASE("llama norms in F16 and BF16") {
      t.types["output_norm.weight"] = weight_type::f16;
      t.types["blk.0.attn_norm.weight"] = weight_type::f16;
      t.types["blk.1.ffn_norm.weight"] = weight_type::bf16;
      t.rope_freqs = true;
      t.write((dir / "m.gguf").string());
      const models::model m((dir / "m.gguf").string());
      const auto& w = m.weights();
      CHECK(floats(w.output_norm, 32) == t.values("output_norm.weight"));
      CHECK(floats(w.layers[0].attn_norm, 32) == t.values("blk.0.attn_norm.weight"));
      CHECK(floats(w.layers[1].ffn_norm, 32) == t.values("blk.1.ffn_norm.weight"));
      CHECK(floats(w.layers[0].ffn_norm, 32) == t.values("blk.0.ffn_norm.weight"));  // F32 as is
    }
    SUBCASE("qwen2 biases in F16") {
      t.arch = "qwen2";
      t.qkv_bias = true;
      t.types["blk.1.attn_q.bias"] = weight_type::f16;
      t.types["blk.1.attn_k.bias"] = weight_type::f16;
      t.write((dir / "m.gguf").string());
      const models::model m((dir / "m.gguf").string());
      const auto& L = m.weights().layers[1];
      CHECK(floats(L.bq, 32) == t.values("blk.1.attn_q.bias"));
      CHECK(floats(L.bk, 16) == t.values("blk.1.attn_k.bias"));
      CHECK(floats(L.bv, 16) == t.values("blk.1.attn_v.bias"));
      CHECK(L.q_norm == nullptr);
    }
    SUBCASE("qwen3 q/k norms in F16") {
      t.arch = "qwen3";
      t.qk_norm = true;
      t.types["blk.0.attn_q_norm.weight"] = weight_type::f16;
      t.write((dir / "m.gguf").string());
      const models::model m((dir / "m.gguf").string());
      const auto& L = m.weights().layers[0];
      CHECK(floats(L.q_norm, 8) == t.values("blk.0.attn_q_norm.weight"));
      CHECK(floats(L.k_norm, 8) == t.values("blk.0.attn_k_norm.weight"));
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

  TEST_CASE("rope_freqs: one type rule for 1-D tensors, and positive finite divisors") {
    test::scratch_dir dir;
    auto t = tiny();  // head_dim 8: 4 divisors
    t.rope_freqs = true;
    SUBCASE("F16 and BF16 are converted like any 1-D tensor") {
      for (auto type : {weight_type::f16, weight_type::bf16}) {
        t.types["rope_freqs.weight"] = type;
        t.write((dir / "m.gguf").string());
        const models::model m((dir / "m.gguf").string());
        CHECK(floats(m.weights().rope_freqs, 4) == t.values("rope_freqs.weight"));
      }
    }
    SUBCASE("a type that is not a float is named") {
      t.types["rope_freqs.weight"] = weight_type::i32;
      t.write((dir / "m.gguf").string());
      const auto msg = model_error((dir / "m.gguf").string());
      CHECK(contains(msg, "'rope_freqs.weight'"));
      CHECK(contains(msg, "I32"));
      CHECK(contains(msg, "F32, F16 or BF16"));
    }
    SUBCASE("bad divisors are refused, naming the tensor and the element") {
      const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
      for (float bad : {0.0f, -1.0f, nan, inf}) {
        CAPTURE(bad);
        t.data["rope_freqs.weight"] = {1.0f, 2.0f, bad, 1.0f};
        t.write((dir / "m.gguf").string());
        const auto msg = model_error((dir / "m.gguf").string());
        CHECK(contains(msg, (dir / "m.gguf").string()));
        CHECK(contains(msg, "'rope_freqs.weight'"));
        CHECK(contains(msg, "element 2"));
      }
    }
    SUBCASE("a bad divisor in F16 is found after conversion") {
      t.types["rope_freqs.weight"] = weight_type::f16;
      t.data["rope_freqs.weight"] = {1.0f, 1.0f, 1.0f, -0.5f};
      t.write((dir / "m.gguf").string());
      CHECK(contains(model_error((dir / "m.gguf").string()), "element 3"));
    }
  }

  TEST_CASE("the tokenizer must have exactly the model's vocabulary") {
    const auto path = test::data_path("stories260K.gguf").string();
    const models::model m(path);
    const auto tok = models::tokenizer::from_gguf(m.file());
    SUBCASE("equal") { CHECK_NOTHROW(models::check_tokenizer_matches(tok, m.config(), path)); }
    SUBCASE("different: the message names the file and both sizes") {
      for (int64_t n_vocab : {int64_t{40}, int64_t{513}}) {
        auto c = m.config();
        c.n_vocab = n_vocab;
        try {
          models::check_tokenizer_matches(tok, c, path);
          FAIL("no error for a model vocabulary of " << n_vocab);
        } catch (const models::gguf_error& e) {
          const std::string msg = e.what();
          CHECK(contains(msg, path));
          CHECK(contains(msg, "512 tokens"));
          CHECK(contains(msg, "has " + std::to_string(n_vocab)));
        }
      }
    }
  }
}
