#include "models/gguf_reader.h"

#include <doctest/doctest.h>

#include "models/gguf_writer.h"
#include "tests/test_support.h"

using namespace tandem;

TEST_SUITE("gguf_reader") {
  TEST_CASE("reads the stories260K test model") {
    models::gguf_file f(test::data_path("stories260K.gguf").string());
    CHECK(f.version() == 3);
    CHECK(f.get_string("general.architecture") == "llama");
    CHECK(f.get_int("llama.embedding_length") == 64);
    CHECK(f.get_int("llama.block_count") == 5);
    const auto& emb = f.tensor("token_embd.weight");
    CHECK(emb.ne == std::vector<int64_t>{64, 512});
    CHECK(emb.type == kernels::weight_type::f32);
    CHECK(emb.bytes == 64 * 512 * 4);
    const auto tokens = f.get_strings("tokenizer.ggml.tokens");
    REQUIRE(tokens);
    CHECK(tokens->size() == 512);
    CHECK_THROWS_AS(f.tensor("nope"), models::gguf_error);
    CHECK_THROWS_AS(f.get_int("general.architecture"), models::gguf_error);
  }
}

TEST_SUITE("gguf_reader") {
  TEST_CASE("a mixed-type file: views, sizes and alignment") {
    models::gguf_file f(test::data_path("stories260K-q8_0.gguf").string());
    CHECK(f.alignment() == 32);
    CHECK(f.data_offset() % 32 == 0);
    const auto* base = reinterpret_cast<const std::byte*>(f.tensors().front().data.data()) - f.data_offset() - f.tensors().front().offset;
    for (const auto& t : f.tensors()) {
      CAPTURE(t.name);
      CHECK(t.offset % 32 == 0);
      CHECK(t.data.size() == t.bytes);
      CHECK(t.data.data() == base + f.data_offset() + t.offset);  // a view into the mapping
      CHECK(t.bytes == static_cast<uint64_t>(kernels::row_bytes(t.type, t.ne[0]) * t.rows()));
      CHECK(f.data_offset() + t.offset + t.bytes <= f.file_size());
    }
    const auto& down = f.tensor("blk.4.ffn_down.weight");
    CHECK(down.type == kernels::weight_type::f16);  // 172 is not a multiple of 32
    CHECK(down.rows() == 64);
    CHECK(down.elements() == 172 * 64);
    CHECK(f.tensor("blk.4.ffn_up.weight").type == kernels::weight_type::q8_0);
    const auto scores = f.get_floats("tokenizer.ggml.scores");
    REQUIRE(scores);
    CHECK(scores->size() == 512);
    const auto types = f.get_ints("tokenizer.ggml.token_type");
    REQUIRE(types);
    CHECK((*types)[0] == 2);  // <unk> is UNKNOWN
    CHECK((*types)[1] == 3);  // <s> is CONTROL
  }

  TEST_CASE("typed getters convert where safe and name the key otherwise") {
    models::gguf_writer w;
    w.set("a.u8", models::gguf_out_value::u8(200));
    w.set("a.i16", models::gguf_out_value::i16(-5));
    w.set("a.u64big", models::gguf_out_value::u64(~0ull));
    w.set("a.f64", models::gguf_out_value::f64(0.5));
    w.set("a.bool", models::gguf_out_value::boolean(false));
    w.set("a.str", models::gguf_out_value::string("s"));
    w.set("a.bools", models::gguf_out_value::bools({true}));
    w.set("a.u64s", models::gguf_out_value::array(std::vector<uint64_t>{1ull << 40}));
    w.set("a.f32s", models::gguf_out_value::array(std::vector<float>{1.5f}));
    test::scratch_dir dir;
    const auto path = (dir / "t.gguf").string();
    w.write(path);
    models::gguf_file f(path);
    CHECK(f.get_int("a.u8") == 200);
    CHECK(f.get_int("a.i16") == -5);
    CHECK(f.get_float("a.u8") == 200.0);
    CHECK(f.get_float("a.f64") == 0.5);
    CHECK(f.get_bool("a.bool") == false);
    CHECK(f.get_int("absent") == std::nullopt);
    CHECK(f.get_string("absent") == std::nullopt);
    CHECK(f.get_strings("absent") == std::nullopt);
    CHECK(f.get_ints("a.u64s") == std::vector<int64_t>{1ll << 40});
    CHECK(f.get_floats("a.u64s") == std::vector<float>{static_cast<float>(1ull << 40)});
    CHECK(f.get_floats("a.f32s") == std::vector<float>{1.5f});
    const auto offset = "offset " + std::to_string(w.layout().kv("a.u64big").key_offset) + ": ";
    CHECK_THROWS_WITH_AS(f.get_int("a.u64big"), (path + ": " + offset + "key 'a.u64big': value out of range").c_str(),
                         models::gguf_error);
    CHECK_THROWS_WITH_AS(f.get_int("a.f64"), doctest::Contains("key 'a.f64': expected an integer, found f64"), models::gguf_error);
    CHECK_THROWS_WITH_AS(f.get_string("a.u8"), doctest::Contains("key 'a.u8': expected a string"), models::gguf_error);
    CHECK_THROWS_WITH_AS(f.get_bool("a.str"), doctest::Contains("key 'a.str'"), models::gguf_error);
    CHECK_THROWS_WITH_AS(f.get_float("a.str"), doctest::Contains("key 'a.str'"), models::gguf_error);
    CHECK_THROWS_WITH_AS(f.get_strings("a.str"), doctest::Contains("key 'a.str'"), models::gguf_error);
    CHECK_THROWS_WITH_AS(f.get_floats("a.bools"), doctest::Contains("key 'a.bools'"), models::gguf_error);
    CHECK_THROWS_WITH_AS(f.get_ints("a.f32s"), doctest::Contains("key 'a.f32s'"), models::gguf_error);
    CHECK_THROWS_WITH_AS(f.tensor("x"), (path + ": tensor 'x' is missing").c_str(), models::gguf_error);
  }

  TEST_CASE("type names and sizes") {
    CHECK(models::gguf_type_name(models::gguf_type::boolean) == "bool");
    CHECK(models::gguf_type_name(models::gguf_type::f64) == "f64");
    CHECK(models::gguf_scalar_size(models::gguf_type::u16) == 2);
    CHECK(models::gguf_scalar_size(models::gguf_type::i64) == 8);
    CHECK(models::gguf_scalar_size(models::gguf_type::string) == 0);
    CHECK(models::gguf_scalar_size(models::gguf_type::array) == 0);
  }

  TEST_CASE("files without tensors") {
    // The qwen2 vocab file ends before its (empty) padded data section: that is fine.
    models::gguf_file f(test::data_path("vocab/ggml-vocab-qwen2.gguf").string());
    CHECK(f.tensors().empty());
    CHECK(f.data_offset() > f.file_size());
    CHECK(f.get_strings("tokenizer.ggml.tokens")->size() == 151936);
    CHECK(f.get_string("tokenizer.ggml.pre") == "qwen2");
  }

  TEST_CASE("I/O errors are runtime_errors naming the path") {
    test::scratch_dir dir;
    const auto path = (dir / "absent.gguf").string();
    CHECK_THROWS_WITH_AS(models::gguf_file{path}, doctest::Contains(path.c_str()), std::runtime_error);
  }
}
