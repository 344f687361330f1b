#include "models/model_config.h"

#include <doctest/doctest.h>

#include <limits>
#include <string>
#include <vector>

#include "models/gguf_writer.h"
#include "tests/models/tiny_model.h"
#include "tests/test_support.h"

using namespace tandem;
using kernels::weight_type;
using models::gguf_out_value;
using models::gguf_writer;
using test::tiny_model;  // llama, n_embd 16, 4 heads (2 kv), n_ff 24, vocab 32, context 64

namespace {

models::model_config config_of(const gguf_writer& w) {
  test::scratch_dir dir;
  w.write((dir / "m.gguf").string());
  const models::gguf_file f((dir / "m.gguf").string());
  return models::read_model_config(f);
}

// The gguf_error message of reading the file's config, or "" (and a failed check) if none.
std::string config_error(const gguf_writer& w) {
  test::scratch_dir dir;
  w.write((dir / "m.gguf").string());
  const models::gguf_file f((dir / "m.gguf").string());
  try {
    models::read_model_config(f);
  } catch (const models::gguf_error& e) {
    const std::string msg = e.what();
    CHECK(msg.find((dir / "m.gguf").string()) != std::string::npos);  // every error names the file
    return msg;
  }
  FAIL_CHECK("read_model_config did not throw");
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST_SUITE("model_config") {
  TEST_CASE("stories260K") {
    const models::gguf_file f(test::data_path("stories260K.gguf").string());
    const auto c = models::read_model_config(f);
    CHECK(c.arch == models::architecture::llama);
    CHECK(c.name == "llama");
    CHECK(c.n_vocab == 512);
    CHECK(c.n_embd == 64);
    CHECK(c.n_layer == 5);
    CHECK(c.n_head == 8);
    CHECK(c.n_head_kv == 4);
    CHECK(c.head_dim == 8);
    CHECK(c.q_dim() == 64);
    CHECK(c.kv_dim() == 32);
    CHECK(c.n_ff == 172);
    CHECK(c.n_ctx_train == 128);
    CHECK(c.rms_eps == doctest::Approx(1e-5f).epsilon(1e-6));
    CHECK(c.n_rot == 8);
    CHECK(c.rope_base == 10000.0f);
    CHECK(c.rope_pairing == kernels::cpu::rope_pairing::adjacent);
    CHECK(c.rope_scaling == models::rope_scaling_type::none);
    CHECK(c.rope_scale_factor == 1.0f);
    CHECK_FALSE(c.has_rope_freqs);
    CHECK_FALSE(c.tied_embeddings);
    CHECK_FALSE(c.qkv_bias);
    CHECK_FALSE(c.qk_norm);
  }

  TEST_CASE("the tiny builder gives a valid llama config with defaults filled in") {
    const tiny_model m;
    const auto c = config_of(m.writer());
    CHECK(c.arch == models::architecture::llama);
    CHECK(c.name == "tiny");
    CHECK(c.n_vocab == 32);
    CHECK(c.n_embd == 16);
    CHECK(c.n_layer == 2);
    CHECK(c.n_head == 4);
    CHECK(c.n_head_kv == 2);
    CHECK(c.head_dim == 4);
    CHECK(c.n_ff == 24);
    CHECK(c.n_ctx_train == 64);
    CHECK(c.rms_eps == doctest::Approx(1e-6f).epsilon(1e-6));
    CHECK(c.n_rot == 4);             // rope.dimension_count absent: the whole head
    CHECK(c.rope_base == 10000.0f);  // llama default
    CHECK(c.rope_orig_ctx == 64);    // defaults to the training context
  }

  TEST_CASE("optional keys take their defaults") {
    tiny_model m;
    m.omit = {"llama.attention.head_count_kv", "llama.context_length", "llama.attention.layer_norm_rms_epsilon", "general.name"};
    m.n_head_kv = m.n_head;  // tensors sized for no grouping
    const auto c = config_of(m.writer());
    CHECK(c.n_head_kv == 4);
    CHECK(c.n_ctx_train == 2048);
    CHECK(c.rms_eps == 1e-5f);
    CHECK(c.name.empty());
  }

  TEST_CASE("architecture") {
    SUBCASE("unknown architecture lists the supported ones") {
      tiny_model m;
      m.arch = "gpt2";
      const auto msg = config_error(m.writer());
      CHECK(contains(msg, "general.architecture"));
      CHECK(contains(msg, "'gpt2'"));
      CHECK(contains(msg, "llama, qwen2, qwen3"));
      CHECK(models::supported_architectures() == "llama, qwen2, qwen3");
    }
    SUBCASE("missing architecture") {
      tiny_model m;
      m.omit = {"general.architecture"};
      const auto msg = config_error(m.writer());
      CHECK(contains(msg, "general.architecture"));
      CHECK(contains(msg, "missing"));
    }
    SUBCASE("names") {
      CHECK(models::architecture_name(models::architecture::llama) == "llama");
      CHECK(models::architecture_name(models::architecture::qwen2) == "qwen2");
      CHECK(models::architecture_name(models::architecture::qwen3) == "qwen3");
    }
  }

  TEST_CASE("missing required keys are named") {
    for (const std::string key : {"llama.embedding_length", "llama.block_count", "llama.feed_forward_length", "llama.attention.head_count"}) {
      CAPTURE(key);
      tiny_model m;
      m.omit = {key};
      const auto msg = config_error(m.writer());
      CHECK(contains(msg, "'" + key + "'"));
      CHECK(contains(msg, "is missing"));
    }
  }

  TEST_CASE("head_count must be a multiple of head_count_kv") {
    tiny_model m;
    m.n_head_kv = 3;
    const auto msg = config_error(m.writer());
    CHECK(contains(msg, "llama.attention.head_count_kv"));
    CHECK(contains(msg, "4 is not a multiple of 3"));
  }

  TEST_CASE("out-of-range values are refused with the value and the range") {
    SUBCASE("zero layers") {
      auto w = tiny_model{}.writer();
      w.set("llama.block_count", gguf_out_value::u32(0));
      const auto msg = config_error(w);
      CHECK(contains(msg, "llama.block_count"));
      CHECK(contains(msg, "value 0 is outside [1, 1024]"));
    }
    SUBCASE("absurd width") {
      auto w = tiny_model{}.writer();
      w.set("llama.embedding_length", gguf_out_value::u64(uint64_t{1} << 40));
      const auto msg = config_error(w);
      CHECK(contains(msg, "llama.embedding_length"));
      CHECK(contains(msg, "outside"));
    }
    SUBCASE("negative head count") {
      auto w = tiny_model{}.writer();
      w.set("llama.attention.head_count", gguf_out_value::i32(-4));
      const auto msg = config_error(w);
      CHECK(contains(msg, "llama.attention.head_count"));
      CHECK(contains(msg, "value -4"));
    }
    SUBCASE("zero kv heads") {
      auto w = tiny_model{}.writer();
      w.set("llama.attention.head_count_kv", gguf_out_value::u32(0));
      CHECK(contains(config_error(w), "llama.attention.head_count_kv"));
    }
    SUBCASE("rope dimension count larger than the head") {
      auto w = tiny_model{}.writer();
      w.set("llama.rope.dimension_count", gguf_out_value::u32(6));
      const auto msg = config_error(w);
      CHECK(contains(msg, "llama.rope.dimension_count"));
      CHECK(contains(msg, "[2, 4]"));
    }
    SUBCASE("odd rope dimension count") {
      tiny_model m;
      m.key_length = 6;
      auto w = m.writer();
      w.set("llama.rope.dimension_count", gguf_out_value::u32(3));
      const auto msg = config_error(w);
      CHECK(contains(msg, "llama.rope.dimension_count"));
      CHECK(contains(msg, "even"));
    }
    SUBCASE("non-positive epsilon") {
      auto w = tiny_model{}.writer();
      w.set("llama.attention.layer_norm_rms_epsilon", gguf_out_value::f32(0.0f));
      CHECK(contains(config_error(w), "llama.attention.layer_norm_rms_epsilon"));
    }
    SUBCASE("non-finite rope base") {
      auto w = tiny_model{}.writer();
      w.set("llama.rope.freq_base", gguf_out_value::f32(std::numeric_limits<float>::infinity()));
      const auto msg = config_error(w);
      CHECK(contains(msg, "llama.rope.freq_base"));
      CHECK(contains(msg, "finite"));
    }
    SUBCASE("rope base of 1") {
      auto w = tiny_model{}.writer();
      w.set("llama.rope.freq_base", gguf_out_value::f32(1.0f));
      CHECK(contains(config_error(w), "llama.rope.freq_base"));
    }
    SUBCASE("value_length different from key_length") {
      auto w = tiny_model{}.writer();
      w.set("llama.attention.value_length", gguf_out_value::u32(8));
      const auto msg = config_error(w);
      CHECK(contains(msg, "llama.attention.value_length"));
      CHECK(contains(msg, "not supported"));
    }
    SUBCASE("width not divisible by the head count without key_length") {
      tiny_model m;
      m.n_embd = 18;  // 18 / 4 heads
      const auto msg = config_error(m.writer());
      CHECK(contains(msg, "llama.attention.head_count"));
      CHECK(contains(msg, "key_length"));
    }
  }

  TEST_CASE("wrong key types are refused with the key and the type found") {
    SUBCASE("string where an integer is expected") {
      auto w = tiny_model{}.writer();
      w.set("llama.block_count", gguf_out_value::string("two"));
      const auto msg = config_error(w);
      CHECK(contains(msg, "llama.block_count"));
      CHECK(contains(msg, "expected an integer"));
    }
    SUBCASE("float where an integer is expected") {
      auto w = tiny_model{}.writer();
      w.set("llama.embedding_length", gguf_out_value::f32(16.0f));
      CHECK(contains(config_error(w), "llama.embedding_length"));
    }
    SUBCASE("string where a number is expected") {
      auto w = tiny_model{}.writer();
      w.set("llama.attention.layer_norm_rms_epsilon", gguf_out_value::string("1e-5"));
      const auto msg = config_error(w);
      CHECK(contains(msg, "llama.attention.layer_norm_rms_epsilon"));
      CHECK(contains(msg, "expected a number"));
    }
    SUBCASE("integer where the architecture string is expected") {
      auto w = tiny_model{}.writer();
      w.set("general.architecture", gguf_out_value::u32(1));
      const auto msg = config_error(w);
      CHECK(contains(msg, "general.architecture"));
      CHECK(contains(msg, "expected a string"));
    }
    SUBCASE("integers of any width are accepted") {
      auto w = tiny_model{}.writer();
      w.set("llama.block_count", gguf_out_value::u8(2));
      w.set("llama.embedding_length", gguf_out_value::i64(16));
      w.set("llama.attention.layer_norm_rms_epsilon", gguf_out_value::f64(1e-6));
      const auto c = config_of(w);
      CHECK(c.n_layer == 2);
      CHECK(c.n_embd == 16);
      CHECK(c.rms_eps == doctest::Approx(1e-6f).epsilon(1e-6));
    }
  }

  TEST_CASE("tensor shapes must agree with the metadata") {
    SUBCASE("a layer matrix: the message names the tensor and both shapes") {
      tiny_model m;
      m.reshape["blk.1.attn_k.weight"] = {16, 12};
      const auto msg = config_error(m.writer());
      CHECK(contains(msg, "'blk.1.attn_k.weight'"));
      CHECK(contains(msg, "{16, 12}"));
      CHECK(contains(msg, "{16, 8}"));
    }
    SUBCASE("ffn_down transposed") {
      tiny_model m;
      m.reshape["blk.0.ffn_down.weight"] = {16, 24};
      const auto msg = config_error(m.writer());
      CHECK(contains(msg, "'blk.0.ffn_down.weight'"));
      CHECK(contains(msg, "{16, 24}"));
      CHECK(contains(msg, "{24, 16}"));
    }
    SUBCASE("a norm with an extra dimension") {
      tiny_model m;
      m.reshape["output_norm.weight"] = {16, 1};
      const auto msg = config_error(m.writer());
      CHECK(contains(msg, "'output_norm.weight'"));
      CHECK(contains(msg, "{16, 1}"));
      CHECK(contains(msg, "{16}"));
    }
    SUBCASE("output.weight with another vocabulary") {
      tiny_model m;
      m.reshape["output.weight"] = {16, 40};
      const auto msg = config_error(m.writer());
      CHECK(contains(msg, "'output.weight'"));
      CHECK(contains(msg, "{16, 40}"));
      CHECK(contains(msg, "{16, 32}"));
    }
    SUBCASE("token_embd of the wrong width") {
      tiny_model m;
      m.reshape["token_embd.weight"] = {20, 32};
      const auto msg = config_error(m.writer());
      CHECK(contains(msg, "'token_embd.weight'"));
      CHECK(contains(msg, "llama.embedding_length"));
    }
    SUBCASE("a missing tensor of the last layer is named") {
      tiny_model m;
      m.omit = {"blk.1.ffn_up.weight"};
      CHECK(contains(config_error(m.writer()), "blk.1.ffn_up.weight"));
    }
  }

  TEST_CASE("vocab_size must agree with token_embd") {
    auto w = tiny_model{}.writer();
    SUBCASE("disagreeing") {
      w.set("llama.vocab_size", gguf_out_value::u32(33));
      const auto msg = config_error(w);
      CHECK(contains(msg, "llama.vocab_size"));
      CHECK(contains(msg, "33"));
      CHECK(contains(msg, "32"));
    }
    SUBCASE("agreeing") {
      w.set("llama.vocab_size", gguf_out_value::u32(32));
      CHECK(config_of(w).n_vocab == 32);
    }
  }

  TEST_CASE("qwen architectures") {
    SUBCASE("qwen2: neox pairing, its rope base default and q/k/v biases") {
      tiny_model m;
      m.arch = "qwen2";
      m.qkv_bias = true;
      const auto c = config_of(m.writer());
      CHECK(c.arch == models::architecture::qwen2);
      CHECK(c.rope_pairing == kernels::cpu::rope_pairing::neox);
      CHECK(c.rope_base == 1000000.0f);
      CHECK(c.qkv_bias);
      CHECK_FALSE(c.qk_norm);
    }
    SUBCASE("qwen2 with a bias of the wrong size") {
      tiny_model m;
      m.arch = "qwen2";
      m.qkv_bias = true;
      m.reshape["blk.0.attn_v.bias"] = {16};
      const auto msg = config_error(m.writer());
      CHECK(contains(msg, "'blk.0.attn_v.bias'"));
      CHECK(contains(msg, "{16}"));
      CHECK(contains(msg, "{8}"));
    }
    SUBCASE("qwen3 with q/k norms and a head wider than n_embd / n_head") {
      tiny_model m;
      m.arch = "qwen3";
      m.qk_norm = true;
      m.key_length = 8;
      const auto c = config_of(m.writer());
      CHECK(c.arch == models::architecture::qwen3);
      CHECK(c.rope_pairing == kernels::cpu::rope_pairing::neox);
      CHECK(c.qk_norm);
      CHECK(c.head_dim == 8);
      CHECK(c.q_dim() == 32);
      CHECK(c.kv_dim() == 16);
      CHECK(c.n_rot == 8);
    }
    SUBCASE("qwen3 without attn_q_norm") {
      tiny_model m;
      m.arch = "qwen3";
      const auto msg = config_error(m.writer());
      CHECK(contains(msg, "'blk.0.attn_q_norm.weight'"));
      CHECK(contains(msg, "missing"));
    }
    SUBCASE("qwen3 with a q norm of the wrong size") {
      tiny_model m;
      m.arch = "qwen3";
      m.qk_norm = true;
      m.reshape["blk.1.attn_k_norm.weight"] = {16};
      CHECK(contains(config_error(m.writer()), "'blk.1.attn_k_norm.weight'"));
    }
    SUBCASE("llama keeps adjacent pairing even with qwen-style extras") {
      tiny_model m;
      m.qkv_bias = true;
      const auto c = config_of(m.writer());
      CHECK(c.rope_pairing == kernels::cpu::rope_pairing::adjacent);
      CHECK(c.qkv_bias);
    }
    SUBCASE("keys are read under the file's architecture prefix") {
      tiny_model m;
      m.arch = "qwen2";
      auto w = m.writer();
      w.set("llama.block_count", gguf_out_value::u32(7));  // ignored: not this architecture
      CHECK(config_of(w).n_layer == 2);
    }
  }

  TEST_CASE("rope scaling") {
    auto w = tiny_model{}.writer();
    SUBCASE("linear") {
      w.set("llama.rope.scaling.type", gguf_out_value::string("linear"));
      w.set("llama.rope.scaling.factor", gguf_out_value::f32(4.0f));
      const auto c = config_of(w);
      CHECK(c.rope_scaling == models::rope_scaling_type::linear);
      CHECK(c.rope_scale_factor == 4.0f);
    }
    SUBCASE("legacy rope.scale_linear") {
      w.set("llama.rope.scale_linear", gguf_out_value::f32(2.0f));
      const auto c = config_of(w);
      CHECK(c.rope_scaling == models::rope_scaling_type::linear);
      CHECK(c.rope_scale_factor == 2.0f);
    }
    SUBCASE("yarn with all its parameters") {
      w.set("llama.rope.scaling.type", gguf_out_value::string("yarn"));
      w.set("llama.rope.scaling.factor", gguf_out_value::f32(8.0f));
      w.set("llama.rope.scaling.original_context_length", gguf_out_value::u32(32));
      w.set("llama.rope.scaling.attn_factor", gguf_out_value::f32(0.5f));
      w.set("llama.rope.scaling.yarn_beta_fast", gguf_out_value::f32(16.0f));
      w.set("llama.rope.scaling.yarn_beta_slow", gguf_out_value::f32(2.0f));
      const auto c = config_of(w);
      CHECK(c.rope_scaling == models::rope_scaling_type::yarn);
      CHECK(c.rope_scale_factor == 8.0f);
      CHECK(c.rope_orig_ctx == 32);
      CHECK(c.yarn_attn_factor == 0.5f);
      CHECK(c.yarn_beta_fast == 16.0f);
      CHECK(c.yarn_beta_slow == 2.0f);
    }
    SUBCASE("yarn defaults") {
      w.set("llama.rope.scaling.type", gguf_out_value::string("yarn"));
      w.set("llama.rope.scaling.factor", gguf_out_value::f32(4.0f));
      const auto c = config_of(w);
      CHECK(c.rope_orig_ctx == 64);
      CHECK(c.yarn_attn_factor == 1.0f);
      CHECK(c.yarn_beta_fast == 32.0f);
      CHECK(c.yarn_beta_slow == 1.0f);
    }
    SUBCASE("explicit none") {
      w.set("llama.rope.scaling.type", gguf_out_value::string("none"));
      CHECK(config_of(w).rope_scaling == models::rope_scaling_type::none);
    }
    SUBCASE("an unsupported type is refused, listing the supported ones") {
      w.set("llama.rope.scaling.type", gguf_out_value::string("longrope"));
      const auto msg = config_error(w);
      CHECK(contains(msg, "llama.rope.scaling.type"));
      CHECK(contains(msg, "'longrope'"));
      CHECK(contains(msg, "none, linear, yarn"));
    }
    SUBCASE("a factor below 1 is refused") {
      w.set("llama.rope.scaling.type", gguf_out_value::string("linear"));
      w.set("llama.rope.scaling.factor", gguf_out_value::f32(0.5f));
      CHECK(contains(config_error(w), "llama.rope.scaling.factor"));
    }
    SUBCASE("custom rope base and partial rotation") {
      w.set("llama.rope.freq_base", gguf_out_value::f32(500000.0f));
      w.set("llama.rope.dimension_count", gguf_out_value::u32(2));
      const auto c = config_of(w);
      CHECK(c.rope_base == 500000.0f);
      CHECK(c.n_rot == 2);
    }
  }

  TEST_CASE("tied embeddings") {
    tiny_model m;
    m.tied = true;
    CHECK(config_of(m.writer()).tied_embeddings);
    m.tied = false;
    CHECK_FALSE(config_of(m.writer()).tied_embeddings);
  }

  TEST_CASE("rope_freqs") {
    // Llama 3 style per-dimension divisors: one per rotated pair (n_rot / 2 = 2 here).
    auto w = tiny_model{}.writer();
    SUBCASE("right shape") {
      w.add_tensor("rope_freqs.weight", {2}, weight_type::f32, std::vector<std::byte>(8));
      CHECK(config_of(w).has_rope_freqs);
    }
    SUBCASE("absent") { CHECK_FALSE(config_of(w).has_rope_freqs); }
    SUBCASE("wrong shape") {
      w.add_tensor("rope_freqs.weight", {4}, weight_type::f32, std::vector<std::byte>(16));
      const auto msg = config_error(w);
      CHECK(contains(msg, "'rope_freqs.weight'"));
      CHECK(contains(msg, "{4}"));
      CHECK(contains(msg, "{2}"));
    }
    SUBCASE("follows rope.dimension_count") {
      w.set("llama.rope.dimension_count", gguf_out_value::u32(2));
      w.add_tensor("rope_freqs.weight", {2}, weight_type::f32, std::vector<std::byte>(8));
      CHECK(contains(config_error(w), "'rope_freqs.weight'"));
    }
    SUBCASE("any type: the type and values are checked when binding (model_test)") {
      w.add_tensor("rope_freqs.weight", {2}, weight_type::f16, std::vector<std::byte>(4));
      CHECK(config_of(w).has_rope_freqs);
    }
  }

  TEST_CASE("size caps keep a hostile header from sizing huge buffers, naming the key") {
    SUBCASE("feed_forward_length above 2^18") {
      auto w = tiny_model{}.writer();
      w.set("llama.feed_forward_length", gguf_out_value::u32((1u << 18) + 1));
      const auto msg = config_error(w);
      CHECK(contains(msg, "'llama.feed_forward_length'"));
      CHECK(contains(msg, "outside [1, 262144]"));
    }
    SUBCASE("feed_forward_length 2^18 passes the cap (and fails only on the tensor shapes)") {
      auto w = tiny_model{}.writer();
      w.set("llama.feed_forward_length", gguf_out_value::u32(1u << 18));
      const auto msg = config_error(w);
      CHECK_FALSE(contains(msg, "'llama.feed_forward_length'"));
      CHECK(contains(msg, "'blk.0.ffn_gate.weight'"));
    }
    SUBCASE("key_length above 1024") {
      auto w = tiny_model{}.writer();
      w.set("llama.attention.key_length", gguf_out_value::u32(1025));
      const auto msg = config_error(w);
      CHECK(contains(msg, "'llama.attention.key_length'"));
      CHECK(contains(msg, "outside [1, 1024]"));
    }
    SUBCASE("a head size above 1024 derived from embedding_length / head_count") {
      auto w = tiny_model{}.writer();
      w.set("llama.embedding_length", gguf_out_value::u32(4096));
      w.set("llama.attention.head_count", gguf_out_value::u32(2));
      const auto msg = config_error(w);
      CHECK(contains(msg, "'llama.attention.head_count'"));
      CHECK(contains(msg, "head size of 2048"));
      CHECK(contains(msg, "1024"));
    }
    SUBCASE("q_dim = head_count x key_length above 2^17") {
      auto w = tiny_model{}.writer();
      w.set("llama.attention.head_count", gguf_out_value::u32(256));
      w.set("llama.attention.head_count_kv", gguf_out_value::u32(256));
      w.set("llama.attention.key_length", gguf_out_value::u32(1024));
      const auto msg = config_error(w);
      CHECK(contains(msg, "'llama.attention.key_length'"));
      CHECK(contains(msg, "262144"));
      CHECK(contains(msg, "131072"));
    }
    SUBCASE("value_length above 1024") {
      auto w = tiny_model{}.writer();
      w.set("llama.attention.value_length", gguf_out_value::u32(2048));
      const auto msg = config_error(w);
      CHECK(contains(msg, "'llama.attention.value_length'"));
      CHECK(contains(msg, "outside [1, 1024]"));
    }
    SUBCASE("context_length above k_max_context") {
      auto w = tiny_model{}.writer();
      w.set("llama.context_length", gguf_out_value::u64(static_cast<uint64_t>(models::k_max_context) + 1));
      const auto msg = config_error(w);
      CHECK(contains(msg, "'llama.context_length'"));
      CHECK(contains(msg, "outside [1, " + std::to_string(models::k_max_context) + "]"));
    }
    SUBCASE("context_length of exactly k_max_context is accepted") {
      tiny_model m;
      m.n_ctx = models::k_max_context;
      CHECK(config_of(m.writer()).n_ctx_train == models::k_max_context);
    }
  }

  TEST_CASE("an odd head size without rope.dimension_count blames the head size's key") {
    SUBCASE("from key_length") {
      tiny_model m;
      m.key_length = 5;
      const auto msg = config_error(m.writer());
      CHECK(contains(msg, "'llama.attention.key_length'"));
      CHECK(contains(msg, "head size 5 is odd"));
      CHECK_FALSE(contains(msg, "'llama.rope.dimension_count'"));
    }
    SUBCASE("from embedding_length / head_count") {
      tiny_model m;
      m.n_embd = 12;  // 3 per head
      const auto msg = config_error(m.writer());
      CHECK(contains(msg, "'llama.attention.head_count'"));
      CHECK(contains(msg, "head size 3 is odd"));
    }
    SUBCASE("an even rope.dimension_count makes an odd head usable") {
      tiny_model m;
      m.key_length = 5;
      auto w = m.writer();
      w.set("llama.rope.dimension_count", gguf_out_value::u32(4));
      const auto c = config_of(w);
      CHECK(c.head_dim == 5);
      CHECK(c.n_rot == 4);
    }
  }

  TEST_CASE("token_embd must have two dimensions") {
    tiny_model m;
    SUBCASE("one") { m.reshape["token_embd.weight"] = {16 * 32}; }
    SUBCASE("three") { m.reshape["token_embd.weight"] = {16, 32, 1}; }
    const auto msg = config_error(m.writer());
    CHECK(contains(msg, "'token_embd.weight'"));
    CHECK(contains(msg, "expected 2"));
    CHECK_FALSE(contains(msg, "first dimension"));
  }

  TEST_CASE("float keys outside float range are refused before the cast") {
    auto w = tiny_model{}.writer();
    SUBCASE("huge") { w.set("llama.rope.freq_base", gguf_out_value::f64(1e300)); }
    SUBCASE("huge negative") { w.set("llama.rope.freq_base", gguf_out_value::f64(-1e39)); }
    const auto msg = config_error(w);
    CHECK(contains(msg, "'llama.rope.freq_base'"));
    CHECK(contains(msg, "range of a float"));
  }

  TEST_CASE("float keys: the largest float itself is still a float") {
    auto w = tiny_model{}.writer();
    w.set("llama.rope.freq_base", gguf_out_value::f64(static_cast<double>(std::numeric_limits<float>::max())));
    CHECK(config_of(w).rope_base == std::numeric_limits<float>::max());
  }

  TEST_CASE("yarn needs beta_fast > beta_slow > 0") {
    auto w = tiny_model{}.writer();
    w.set("llama.rope.scaling.type", gguf_out_value::string("yarn"));
    w.set("llama.rope.scaling.factor", gguf_out_value::f32(4.0f));
    SUBCASE("fast below slow") {
      w.set("llama.rope.scaling.yarn_beta_fast", gguf_out_value::f32(1.0f));
      w.set("llama.rope.scaling.yarn_beta_slow", gguf_out_value::f32(32.0f));
      const auto msg = config_error(w);
      CHECK(contains(msg, "'llama.rope.scaling.yarn_beta_fast'"));
      CHECK(contains(msg, "greater than yarn_beta_slow"));
    }
    SUBCASE("fast equal to slow") {
      w.set("llama.rope.scaling.yarn_beta_fast", gguf_out_value::f32(2.0f));
      w.set("llama.rope.scaling.yarn_beta_slow", gguf_out_value::f32(2.0f));
      CHECK(contains(config_error(w), "'llama.rope.scaling.yarn_beta_fast'"));
    }
    SUBCASE("slow zero") {
      w.set("llama.rope.scaling.yarn_beta_slow", gguf_out_value::f32(0.0f));
      const auto msg = config_error(w);
      CHECK(contains(msg, "'llama.rope.scaling.yarn_beta_slow'"));
      CHECK(contains(msg, "positive"));
    }
    SUBCASE("slow negative") {
      w.set("llama.rope.scaling.yarn_beta_slow", gguf_out_value::f32(-1.0f));
      CHECK(contains(config_error(w), "'llama.rope.scaling.yarn_beta_slow'"));
    }
    SUBCASE("attention factor zero") {
      w.set("llama.rope.scaling.attn_factor", gguf_out_value::f32(0.0f));
      CHECK(contains(config_error(w), "'llama.rope.scaling.attn_factor'"));
    }
  }

  TEST_CASE("yarn betas are not checked when yarn is not used (they are not read)") {
    auto w = tiny_model{}.writer();
    w.set("llama.rope.scaling.type", gguf_out_value::string("linear"));
    w.set("llama.rope.scaling.factor", gguf_out_value::f32(2.0f));
    w.set("llama.rope.scaling.yarn_beta_fast", gguf_out_value::f32(1.0f));
    w.set("llama.rope.scaling.yarn_beta_slow", gguf_out_value::f32(32.0f));
    CHECK(config_of(w).rope_scaling == models::rope_scaling_type::linear);
  }
}
