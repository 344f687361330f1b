#include "models/synth.h"

#include <doctest/doctest.h>

#include <cmath>
#include <map>

#include "kernels/cpu/quants.h"
#include "models/gguf_reader.h"
#include "models/gguf_writer.h"
#include "tests/test_support.h"

using namespace tandem;
using kernels::weight_type;

namespace {

models::synth_options small(const std::string& arch) {
  models::synth_options o;
  o.arch = arch;
  o.dim = 64;
  o.layers = 2;
  o.heads = 4;
  o.kv_heads = 2;
  o.ffn = 96;
  o.context = 256;
  o.vocab_path = test::data_path("stories260K.gguf").string();
  o.type = weight_type::f16;
  o.seed = 42;
  return o;
}

std::vector<float> dequantized(const models::gguf_tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.elements()));
  kernels::cpu::dequantize_row(t.type, t.data.data(), out.data(), t.elements());
  return out;
}

void mean_std(const std::vector<float>& v, double& mean, double& stddev) {
  double s = 0, s2 = 0;
  for (float x : v) s += x, s2 += static_cast<double>(x) * x;
  mean = s / static_cast<double>(v.size());
  stddev = std::sqrt(s2 / static_cast<double>(v.size()) - mean * mean);
}

}  // namespace

TEST_SUITE("synth") {
  TEST_CASE("the same seed gives a byte-identical file; another seed does not") {
    test::scratch_dir dir;
    auto o = small("llama");
    o.type = weight_type::q8_0;
    models::synth_model(o, (dir / "a.gguf").string());
    models::synth_model(o, (dir / "b.gguf").string());
    o.seed = 43;
    models::synth_model(o, (dir / "c.gguf").string());
    const auto a = test::read_file(dir / "a.gguf"), b = test::read_file(dir / "b.gguf"), c = test::read_file(dir / "c.gguf");
    CHECK(a.size() > 100000);
    CHECK(a == b);
    CHECK(a.size() == c.size());
    CHECK(a != c);
  }

  TEST_CASE("the bytes do not depend on how many threads generate them") {
    test::scratch_dir dir;
    auto o = small("qwen3");
    o.type = weight_type::q4_0;
    o.threads = 1;
    models::synth_model(o, (dir / "one.gguf").string());
    o.threads = 3;
    models::synth_model(o, (dir / "three.gguf").string());
    o.threads = 0;
    models::synth_model(o, (dir / "auto.gguf").string());
    const auto one = test::read_file(dir / "one.gguf");
    CHECK(one == test::read_file(dir / "three.gguf"));
    CHECK(one == test::read_file(dir / "auto.gguf"));
  }

  TEST_CASE("metadata and tensors for each architecture") {
    const models::gguf_file vocab(test::data_path("stories260K.gguf").string());
    for (const std::string arch : {"llama", "qwen2", "qwen3"}) {
      for (bool tied : {false, true}) {
        CAPTURE(arch);
        CAPTURE(tied);
        test::scratch_dir dir;
        auto o = small(arch);
        o.tied = tied;
        if (arch == "qwen3") o.head_dim = 32;  // 4 heads x 32 != 64: key_length must be written
        const auto path = (dir / "m.gguf").string();
        const auto report = models::synth_model(o, path);
        CHECK(report.notes.empty());
        const models::gguf_file f(path);
        CHECK(report.bytes == f.file_size());

        CHECK(f.get_string("general.architecture") == arch);
        CHECK(f.get_string("general.name") == "synth-" + arch);
        CHECK(f.get_int("general.file_type") == 1);
        CHECK(f.get_int("general.quantization_version") == 2);
        CHECK(f.get_int(arch + ".vocab_size") == 512);
        CHECK(f.get_int(arch + ".context_length") == 256);
        CHECK(f.get_int(arch + ".embedding_length") == 64);
        CHECK(f.get_int(arch + ".block_count") == 2);
        CHECK(f.get_int(arch + ".feed_forward_length") == 96);
        CHECK(f.get_int(arch + ".attention.head_count") == 4);
        CHECK(f.get_int(arch + ".attention.head_count_kv") == 2);
        const int64_t hd = arch == "qwen3" ? 32 : 16;
        CHECK(f.get_int(arch + ".rope.dimension_count") == hd);
        CHECK(f.get_float(arch + ".rope.freq_base") == (arch == "llama" ? 10000.0 : 1e6));
        CHECK(f.get_float(arch + ".attention.layer_norm_rms_epsilon") == doctest::Approx(arch == "llama" ? 1e-5 : 1e-6));
        CHECK(f.find(arch + ".attention.layer_norm_rms_epsilon")->type == models::gguf_type::f32);
        CHECK(f.get_int(arch + ".attention.key_length") == (arch == "qwen3" ? std::optional<int64_t>(32) : std::nullopt));
        CHECK(f.get_int(arch + ".attention.value_length") == (arch == "qwen3" ? std::optional<int64_t>(32) : std::nullopt));
        // Every tokenizer key of the vocab file, unchanged.
        int copied = 0;
        for (const auto& kv : vocab.metadata()) {
          if (!kv.key.starts_with("tokenizer.")) continue;
          CAPTURE(kv.key);
          const auto* v = f.find(kv.key);
          REQUIRE(v);
          CHECK(v->type == kv.value.type);
          CHECK(v->u == kv.value.u);
          CHECK(v->str == kv.value.str);
          CHECK(v->strings == kv.value.strings);
          CHECK(std::equal(v->raw.begin(), v->raw.end(), kv.value.raw.begin(), kv.value.raw.end()));
          ++copied;
        }
        CHECK(copied == 9);

        const int64_t q = 4 * hd, kv = 2 * hd;
        std::map<std::string, std::vector<int64_t>> want = {{"token_embd.weight", {64, 512}}, {"output_norm.weight", {64}}};
        if (!tied) want["output.weight"] = {64, 512};
        for (int l = 0; l < 2; ++l) {
          const std::string b = "blk." + std::to_string(l) + ".";
          want[b + "attn_norm.weight"] = {64};
          want[b + "attn_q.weight"] = {64, q};
          want[b + "attn_k.weight"] = {64, kv};
          want[b + "attn_v.weight"] = {64, kv};
          want[b + "attn_output.weight"] = {q, 64};
          want[b + "ffn_norm.weight"] = {64};
          want[b + "ffn_gate.weight"] = {64, 96};
          want[b + "ffn_up.weight"] = {64, 96};
          want[b + "ffn_down.weight"] = {96, 64};
          if (arch == "qwen2") {
            want[b + "attn_q.bias"] = {q};
            want[b + "attn_k.bias"] = {kv};
            want[b + "attn_v.bias"] = {kv};
          }
          if (arch == "qwen3") {
            want[b + "attn_q_norm.weight"] = {hd};
            want[b + "attn_k_norm.weight"] = {hd};
          }
        }
        CHECK(f.tensors().size() == want.size());
        int64_t params = 0;
        for (const auto& t : f.tensors()) {
          CAPTURE(t.name);
          REQUIRE(want.count(t.name) == 1);
          CHECK(t.ne == want[t.name]);
          CHECK(t.type == (t.ne.size() == 1 ? weight_type::f32 : weight_type::f16));
          params += t.elements();
        }
        CHECK(report.parameters == params);
      }
    }
  }

  TEST_CASE("weights have the documented scale") {
    test::scratch_dir dir;
    auto o = small("qwen2");
    o.type = weight_type::f32;
    o.layers = 8;
    const auto path = (dir / "m.gguf").string();
    models::synth_model(o, path);
    const models::gguf_file f(path);
    double mean = 0, sd = 0;
    mean_std(dequantized(f.tensor("token_embd.weight")), mean, sd);
    CHECK(std::abs(mean) < 0.002);
    CHECK(sd == doctest::Approx(0.02).epsilon(0.05));
    mean_std(dequantized(f.tensor("blk.3.ffn_down.weight")), mean, sd);
    CHECK(sd == doctest::Approx(0.02 / 4.0).epsilon(0.1));  // shrunk by sqrt(2 * 8 layers)
    mean_std(dequantized(f.tensor("blk.3.attn_norm.weight")), mean, sd);
    CHECK(mean == doctest::Approx(1.0).epsilon(0.01));
    CHECK(sd < 0.04);
    mean_std(dequantized(f.tensor("blk.3.attn_q.bias")), mean, sd);
    CHECK(std::abs(mean) < 0.01);
    // Different tensors are not copies of one stream.
    const auto q = dequantized(f.tensor("blk.0.attn_q.weight"));
    const auto k = dequantized(f.tensor("blk.0.attn_k.weight"));
    CHECK(q[0] != k[0]);
    CHECK(q[1] != k[1]);
  }

  TEST_CASE("quantized files carry the same weights, rounded") {
    // The floats depend only on the seed, so a Q8_0 file dequantizes to the F32 file's values.
    test::scratch_dir dir;
    auto o = small("llama");
    o.type = weight_type::f32;
    models::synth_model(o, (dir / "f32.gguf").string());
    o.type = weight_type::q8_0;
    models::synth_model(o, (dir / "q8.gguf").string());
    const models::gguf_file a((dir / "f32.gguf").string()), b((dir / "q8.gguf").string());
    CHECK(b.get_int("general.file_type") == 7);
    for (const char* name : {"token_embd.weight", "blk.1.ffn_down.weight", "output.weight"}) {
      CAPTURE(name);
      CHECK(b.tensor(name).type == weight_type::q8_0);
      const auto x = dequantized(a.tensor(name)), y = dequantized(b.tensor(name));
      REQUIRE(x.size() == y.size());
      double worst = 0;
      for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, static_cast<double>(std::abs(x[i] - y[i])));
      CHECK(worst < 0.001);
    }
  }

  TEST_CASE("a dimension that does not fit the block falls back to Q8_0 or F16") {
    test::scratch_dir dir;
    auto o = small("llama");
    o.dim = 256;
    o.heads = 4;
    o.kv_heads = 4;
    o.ffn = 96;  // ffn_down has ne[0] = 96: Q8_0 (96 % 32 == 0)
    o.type = weight_type::q4_k;
    auto report = models::synth_model(o, (dir / "a.gguf").string());
    {
      const models::gguf_file f((dir / "a.gguf").string());
      CHECK(f.get_int("general.file_type") == 14);
      CHECK(f.tensor("token_embd.weight").type == weight_type::q4_k);
      CHECK(f.tensor("blk.0.attn_q.weight").type == weight_type::q4_k);
      CHECK(f.tensor("blk.0.ffn_up.weight").type == weight_type::q4_k);
      CHECK(f.tensor("blk.0.ffn_down.weight").type == weight_type::q8_0);
      CHECK(f.tensor("blk.1.ffn_down.weight").type == weight_type::q8_0);
      CHECK(f.tensor("blk.0.attn_norm.weight").type == weight_type::f32);
    }
    REQUIRE(report.notes.size() == 1);  // one note for the kind, not one per layer
    CHECK(report.notes[0].find("blk.*.ffn_down.weight") != std::string::npos);
    CHECK(report.notes[0].find("Q8_0") != std::string::npos);

    o.ffn = 48;  // 48 % 32 != 0: F16
    o.type = weight_type::q8_0;
    report = models::synth_model(o, (dir / "b.gguf").string());
    const models::gguf_file f((dir / "b.gguf").string());
    CHECK(f.tensor("blk.0.ffn_down.weight").type == weight_type::f16);
    CHECK(f.tensor("blk.0.ffn_gate.weight").type == weight_type::q8_0);
    REQUIRE(report.notes.size() == 1);
    CHECK(report.notes[0].find("F16") != std::string::npos);
  }

  TEST_CASE("bad options are refused with the option's name") {
    test::scratch_dir dir;
    const auto out = (dir / "x.gguf").string();
    auto refused = [&](models::synth_options o, const std::string& part) {
      CAPTURE(part);
      try {
        models::synth_model(o, out);
        FAIL("accepted");
      } catch (const std::invalid_argument& e) {
        CHECK(std::string(e.what()).find(part) != std::string::npos);
      }
      CHECK_FALSE(std::filesystem::exists(out));
    };
    auto o = small("llama");
    o.arch = "gpt2";
    refused(o, "--arch 'gpt2'");
    o = small("llama");
    o.dim = 0;
    refused(o, "--dim");
    o = small("llama");
    o.kv_heads = 3;
    refused(o, "--kv-heads 3");
    o = small("llama");
    o.dim = 66;
    refused(o, "--dim 66");
    o = small("qwen2");
    o.head_dim = 32;
    refused(o, "qwen2");
    o = small("qwen3");
    o.head_dim = 15;
    refused(o, "--head-dim 15");
    o = small("llama");
    o.type = weight_type::q2_k;
    refused(o, "--type Q2_K");

    o = small("llama");
    o.vocab_path = (dir / "missing.gguf").string();
    CHECK_THROWS_AS(models::synth_model(o, out), std::runtime_error);
    // A GGUF file without a tokenizer.
    models::gguf_writer w;
    w.set("general.architecture", models::gguf_out_value::string("llama"));
    w.write((dir / "novocab.gguf").string());
    o.vocab_path = (dir / "novocab.gguf").string();
    CHECK_THROWS_WITH_AS(models::synth_model(o, out), doctest::Contains("tokenizer.ggml.tokens"), models::gguf_error);
    CHECK_FALSE(std::filesystem::exists(out));
  }

  TEST_CASE("supported types") {
    CHECK(models::synth_supports(weight_type::q4_k));
    CHECK(models::synth_supports(weight_type::bf16));
    CHECK_FALSE(models::synth_supports(weight_type::iq2_xxs));
    CHECK_FALSE(models::synth_supports(weight_type::q8_k));
  }
}
