#include "models/gguf_reader.h"

#include <doctest/doctest.h>

#include <cfloat>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>

#include "models/gguf_writer.h"
#include "tests/test_support.h"

using namespace tandem;

namespace {

// A GGUF v3 file with `n_keys` u32 keys "k.<i>" = i and `n_tensors` F32 tensors "t.<i>" of
// 8 elements, tensor i at data offset 32 i. Built by hand: the writer checks names for
// duplicates one by one, which is too slow for hundreds of thousands.
void write_many_names(const std::string& path, uint32_t n_keys, uint32_t n_tensors) {
  std::vector<char> b;
  auto put = [&b](const auto& v) {
    const auto at = b.size();
    b.resize(at + sizeof(v));
    std::memcpy(b.data() + at, &v, sizeof(v));
  };
  auto put_string = [&](const std::string& s) {
    put(static_cast<uint64_t>(s.size()));
    b.insert(b.end(), s.begin(), s.end());
  };
  put(uint32_t{0x46554747});
  put(uint32_t{3});
  put(static_cast<uint64_t>(n_tensors));
  put(static_cast<uint64_t>(n_keys));
  for (uint32_t k = 0; k < n_keys; ++k) {
    put_string("k." + std::to_string(k));
    put(static_cast<uint32_t>(models::gguf_type::u32));
    put(k);
  }
  for (uint32_t k = 0; k < n_tensors; ++k) {
    put_string("t." + std::to_string(k));
    put(uint32_t{1});  // dimensions
    put(uint64_t{8});  // ne[0]
    put(uint32_t{0});  // F32
    put(uint64_t{32} * k);
  }
  b.resize((b.size() + 31) / 32 * 32 + uint64_t{32} * n_tensors);
  std::ofstream(path, std::ios::binary).write(b.data(), static_cast<std::streamsize>(b.size()));
}

}  // namespace

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
    CHECK_THROWS_WITH_AS(f.get_int("a.u64big"), (path + ": " + offset + "key 'a.u64big': value out of range").c_str(), models::gguf_error);
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

TEST_SUITE("gguf_reader") {
  TEST_CASE("hundreds of thousands of tensors and keys are looked up by hash") {
    // With a linear scan, looking every name up would take ~10^10 string compares.
    constexpr uint32_t n_keys = 50000, n_tensors = 200000;
    test::scratch_dir dir;
    const auto path = (dir / "many.gguf").string();
    write_many_names(path, n_keys, n_tensors);
    models::gguf_file f(path);
    REQUIRE(f.tensors().size() == n_tensors);
    REQUIRE(f.metadata().size() == n_keys);
    uint32_t found = 0;
    for (uint32_t k = 0; k < n_tensors; ++k) {
      const auto* t = f.find_tensor("t." + std::to_string(k));
      found += t && t->offset == uint64_t{32} * k && t->name == "t." + std::to_string(k);
    }
    CHECK(found == n_tensors);
    found = 0;
    for (uint32_t k = 0; k < n_keys; ++k) found += f.get_int("k." + std::to_string(k)) == int64_t{k};
    CHECK(found == n_keys);
    CHECK(f.find_tensor("t.200000") == nullptr);
    CHECK(f.find_tensor("t.") == nullptr);
    CHECK(f.find("k.50000") == nullptr);

    // The indexes view names stored inside the file object, so they must survive a move.
    models::gguf_file moved(std::move(f));
    CHECK(moved.tensor("t.123456").offset == 32 * 123456);
    CHECK(moved.get_int("k.49999") == 49999);
    CHECK_THROWS_WITH_AS(moved.get_string("k.7"), doctest::Contains("offset "), models::gguf_error);
  }

  TEST_CASE("float conversions out of range are refused or clamped, never undefined") {
    models::gguf_writer w;
    const double inf = std::numeric_limits<double>::infinity();
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const double two_63 = 9223372036854775808.0;
    w.set("f64.big", models::gguf_out_value::array(std::vector<double>{1.0, -1e300}));
    w.set("f64.edge", models::gguf_out_value::array(std::vector<double>{FLT_MAX, -FLT_MAX, inf, -inf, nan, 1e-300}));
    w.set("f64.ints", models::gguf_out_value::array(std::vector<double>{1e30, -1e30, nan, 2.9, -2.9, two_63, -two_63, inf}));
    w.set("f32.ints", models::gguf_out_value::array(std::vector<float>{3e38f, -3e38f, -7.5f}));
    w.set("u64.big", models::gguf_out_value::array(std::vector<uint64_t>{1, 1ull << 63, ~0ull}));
    test::scratch_dir dir;
    const auto path = (dir / "ranges.gguf").string();
    w.write(path);
    models::gguf_file f(path);

    SUBCASE("get_floats refuses finite doubles beyond FLT_MAX, naming the key and element") {
      CHECK_THROWS_WITH_AS(f.get_floats("f64.big"), doctest::Contains("key 'f64.big': element 1 ("), models::gguf_error);
      CHECK_THROWS_WITH_AS(f.get_floats("f64.big"), doctest::Contains("out of the float range"), models::gguf_error);
      const auto edge = f.get_floats("f64.edge");
      REQUIRE(edge);
      REQUIRE(edge->size() == 6);
      CHECK((*edge)[0] == FLT_MAX);
      CHECK((*edge)[1] == -FLT_MAX);
      CHECK((*edge)[2] == std::numeric_limits<float>::infinity());
      CHECK((*edge)[3] == -std::numeric_limits<float>::infinity());
      CHECK(std::isnan((*edge)[4]));
      CHECK((*edge)[5] == 0.0f);
    }
    SUBCASE("array_integer truncates and saturates floats") {
      const auto* d = f.find("f64.ints");
      REQUIRE(d);
      constexpr auto max = std::numeric_limits<int64_t>::max();
      constexpr auto min = std::numeric_limits<int64_t>::min();
      const std::vector<int64_t> want = {max, min, 0, 2, -2, max, min, max};
      for (uint64_t k = 0; k < want.size(); ++k) {
        CAPTURE(k);
        CHECK(d->array_integer(k) == want[k]);
      }
      const auto* s = f.find("f32.ints");
      CHECK(s->array_integer(0) == max);
      CHECK(s->array_integer(1) == min);
      CHECK(s->array_integer(2) == -7);
      // get_ints still refuses float arrays outright.
      CHECK_THROWS_WITH_AS(f.get_ints("f64.ints"), doctest::Contains("key 'f64.ints': expected an array of integers"), models::gguf_error);
    }
    SUBCASE("u64 elements beyond int64") {
      CHECK_THROWS_WITH_AS(f.get_ints("u64.big"), doctest::Contains("key 'u64.big': element 1 (9223372036854775808) is out of range"),
                           models::gguf_error);
      CHECK(f.find("u64.big")->array_integer(2) == std::numeric_limits<int64_t>::max());
      CHECK(f.get_floats("u64.big")->at(2) == static_cast<float>(~0ull));
    }
  }
}
