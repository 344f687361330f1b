// `tandem inspect` through the real executable.
#include <doctest/doctest.h>

#include <fstream>
#include <sstream>

#include "tests/test_support.h"

using namespace tandem;

namespace {

// The output line that starts (after indentation) with `key`; empty when there is none.
std::string line_of(const std::string& out, const std::string& key) {
  std::istringstream in(out);
  for (std::string line; std::getline(in, line);)
    if (line.rfind("  " + key + " ", 0) == 0) return line;
  return {};
}

}  // namespace

TEST_SUITE("inspect") {
  TEST_CASE("header, metadata, tensor table and totals of the stories260K model") {
    const auto path = test::data_path("stories260K.gguf").string();
    const auto r = test::run_tandem("inspect '" + path + "'");
    REQUIRE(r.exit_code == 0);
    CHECK(r.err.empty());
    CHECK(r.out.find("GGUF version 3, 1185376 bytes, alignment 32, data section at offset 14176") != std::string::npos);
    CHECK(r.out.find("metadata: 19 keys") != std::string::npos);
    // Arrays: element type, length, the first few elements.
    const auto tokens = line_of(r.out, "tokenizer.ggml.tokens");
    CHECK(tokens.find("[string x 512] \"<unk>\", \"<s>\", \"</s>\", ...") != std::string::npos);
    CHECK(line_of(r.out, "tokenizer.ggml.token_type").find("[i32 x 512] 2, 3, 3, 6, 6, 6, ...") != std::string::npos);
    // Scalars: key, type, value.
    const auto emb = line_of(r.out, "llama.embedding_length");
    CHECK(emb.find(" u32 ") != std::string::npos);
    CHECK(emb.substr(emb.size() - 3) == " 64");
    CHECK(line_of(r.out, "general.architecture").find("string  \"llama\"") != std::string::npos);
    CHECK(line_of(r.out, "llama.attention.layer_norm_rms_epsilon").find("f32     1e-05") != std::string::npos);
    // Tensor table: name, type, dims, bytes, offset.
    CHECK(r.out.find("tensors: 48") != std::string::npos);
    const auto te = line_of(r.out, "token_embd.weight");
    for (const char* part : {" F32 ", " 64 x 512 ", " 131072 ", " 14176"}) {
      CAPTURE(part);
      CHECK(te.find(part) != std::string::npos);
    }
    const auto norm = line_of(r.out, "output_norm.weight");
    CHECK(norm.find(" 256 ") != std::string::npos);
    CHECK(norm.find(" 145248") != std::string::npos);
    // Totals: count, parameters, bytes by type.
    CHECK(r.out.find("totals: 48 tensors, 292800 parameters, 1171200 bytes") != std::string::npos);
    CHECK(line_of(r.out, "F32").find("48 tensors") != std::string::npos);
  }

  TEST_CASE("bytes by type for a mixed file") {
    const auto r = test::run_tandem("inspect '" + test::data_path("stories260K-q8_0.gguf").string() + "'");
    REQUIRE(r.exit_code == 0);
    CHECK(line_of(r.out, "Q8_0").find("32 tensors") != std::string::npos);
    CHECK(line_of(r.out, "F16").find("5 tensors") != std::string::npos);
    CHECK(line_of(r.out, "F32").find("11 tensors") != std::string::npos);
    CHECK(line_of(r.out, "blk.4.ffn_down.weight").find(" F16 ") != std::string::npos);
  }

  TEST_CASE("long strings are cut with their length, merges are summarised") {
    const auto r = test::run_tandem("inspect '" + test::data_path("vocab/ggml-vocab-qwen2.gguf").string() + "'");
    REQUIRE(r.exit_code == 0);
    const auto tmpl = line_of(r.out, "tokenizer.chat_template");
    CHECK(tmpl.find("string  \"{% for message in messages %}") != std::string::npos);
    CHECK(tmpl.find("\"... (327 bytes)") != std::string::npos);
    CHECK(tmpl.size() < 160);
    CHECK(line_of(r.out, "tokenizer.ggml.merges").find("[string x 151387] \"Ġ Ġ\", ") != std::string::npos);
    CHECK(line_of(r.out, "tokenizer.ggml.tokens").find("[string x 151936] \"!\", \"\\\"\", \"#\", ...") != std::string::npos);
    CHECK(r.out.find("tensors: 0") != std::string::npos);
  }

  TEST_CASE("a malformed file: message on stderr, exit status 1") {
    test::scratch_dir dir;
    const auto bytes = test::read_file(test::data_path("stories260K.gguf"));
    SUBCASE("truncated inside the token list") {
      const auto path = (dir / "cut.gguf").string();
      std::ofstream(path, std::ios::binary).write(bytes.data(), 3000);
      const auto r = test::run_tandem("inspect '" + path + "'");
      CHECK(r.exit_code == 1);
      CHECK(r.out.empty());
      CHECK(r.err.find(path + ": offset ") != std::string::npos);
      CHECK(r.err.find("key 'tokenizer.ggml.tokens'") != std::string::npos);
    }
    SUBCASE("truncated inside the tensor data") {
      const auto path = (dir / "cut.gguf").string();
      std::ofstream(path, std::ios::binary).write(bytes.data(), static_cast<std::streamsize>(bytes.size() - 100));
      const auto r = test::run_tandem("inspect '" + path + "'");
      CHECK(r.exit_code == 1);
      CHECK(r.err.find(path + ": offset ") != std::string::npos);
      CHECK(r.err.find("tensor '") != std::string::npos);
      CHECK(r.err.find("extends past the end") != std::string::npos);
    }
    SUBCASE("not a GGUF file") {
      const auto path = (dir / "text.gguf").string();
      std::ofstream(path) << "hello, world\n";
      const auto r = test::run_tandem("inspect '" + path + "'");
      CHECK(r.exit_code == 1);
      CHECK(r.err.find("bad magic") != std::string::npos);
    }
    SUBCASE("missing file") {
      const auto path = (dir / "missing.gguf").string();
      const auto r = test::run_tandem("inspect '" + path + "'");
      CHECK(r.exit_code == 1);
      CHECK(r.err.find(path) != std::string::npos);
    }
  }
}
