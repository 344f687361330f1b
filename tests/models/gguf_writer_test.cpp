#include "models/gguf_writer.h"

#include <doctest/doctest.h>

#include <cstring>
#include <fstream>

#include "tests/test_support.h"

using namespace tandem;
using kernels::weight_type;
using models::gguf_out_value;
using models::gguf_type;
using models::gguf_writer;

namespace {

std::string save(const test::scratch_dir& dir, const std::string& name, const std::vector<std::byte>& bytes) {
  const auto p = (dir / name).string();
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  return p;
}

std::vector<std::byte> bytes_of(const std::vector<float>& v) {
  std::vector<std::byte> out(v.size() * sizeof(float));
  std::memcpy(out.data(), v.data(), out.size());
  return out;
}

}  // namespace

TEST_SUITE("gguf_writer") {
  TEST_CASE("metadata of every value type round-trips through the reader") {
    gguf_writer w;
    w.set("t.u8", gguf_out_value::u8(250));
    w.set("t.i8", gguf_out_value::i8(-120));
    w.set("t.u16", gguf_out_value::u16(65000));
    w.set("t.i16", gguf_out_value::i16(-32000));
    w.set("t.u32", gguf_out_value::u32(4000000000u));
    w.set("t.i32", gguf_out_value::i32(-2000000000));
    w.set("t.u64", gguf_out_value::u64(1ull << 60));
    w.set("t.i64", gguf_out_value::i64(-(1ll << 60)));
    w.set("t.f32", gguf_out_value::f32(1.5f));
    w.set("t.f64", gguf_out_value::f64(-2.25e100));
    w.set("t.bool", gguf_out_value::boolean(true));
    w.set("t.str", gguf_out_value::string("héllo"));
    w.set("t.empty", gguf_out_value::string(""));
    w.set("t.a_i32", gguf_out_value::array(std::vector<int32_t>{-1, 2, -3}));
    w.set("t.a_u16", gguf_out_value::array(std::vector<uint16_t>{7, 8}));
    w.set("t.a_f32", gguf_out_value::array(std::vector<float>{0.5f, -0.25f}));
    w.set("t.a_f64", gguf_out_value::array(std::vector<double>{1e-300}));
    w.set("t.a_i64", gguf_out_value::array(std::vector<int64_t>{}));
    w.set("t.a_bool", gguf_out_value::bools({true, false, true}));
    w.set("t.a_str", gguf_out_value::strings({"<unk>", "", "a b"}));
    w.set("t.nested", gguf_out_value::arrays({gguf_out_value::array(std::vector<uint8_t>{1, 2}), gguf_out_value::strings({"x"}),
                                              gguf_out_value::arrays({gguf_out_value::bools({false})})}));
    test::scratch_dir dir;
    const auto path = (dir / "all.gguf").string();
    w.write(path);
    models::gguf_file f(path);
    CHECK(f.version() == 3);
    CHECK(f.metadata().size() == 21);
    CHECK(f.metadata()[0].key == "t.u8");  // insertion order is kept
    CHECK(f.find("t.u8")->type == gguf_type::u8);
    CHECK(f.get_int("t.u8") == 250);
    CHECK(f.get_int("t.i8") == -120);
    CHECK(f.get_int("t.u16") == 65000);
    CHECK(f.get_int("t.i16") == -32000);
    CHECK(f.get_int("t.u32") == 4000000000ll);
    CHECK(f.find("t.u32")->type == gguf_type::u32);
    CHECK(f.get_int("t.i32") == -2000000000);
    CHECK(f.get_int("t.u64") == (1ll << 60));
    CHECK(f.get_int("t.i64") == -(1ll << 60));
    CHECK(f.get_float("t.f32") == 1.5);
    CHECK(f.find("t.f32")->type == gguf_type::f32);
    CHECK(f.get_float("t.f64") == -2.25e100);
    CHECK(f.get_bool("t.bool") == true);
    CHECK(f.get_string("t.str") == "héllo");
    CHECK(f.get_string("t.empty") == "");
    CHECK(f.get_ints("t.a_i32") == std::vector<int64_t>{-1, 2, -3});
    CHECK(f.find("t.a_i32")->elem_type == gguf_type::i32);
    CHECK(f.get_ints("t.a_u16") == std::vector<int64_t>{7, 8});
    CHECK(f.find("t.a_u16")->elem_type == gguf_type::u16);
    CHECK(f.get_floats("t.a_f32") == std::vector<float>{0.5f, -0.25f});
    CHECK(f.find("t.a_f64")->array_number(0) == 1e-300);
    CHECK(f.find("t.a_i64")->count == 0);
    CHECK(f.find("t.a_i64")->elem_type == gguf_type::i64);
    const auto* b = f.find("t.a_bool");
    REQUIRE(b);
    CHECK(b->elem_type == gguf_type::boolean);
    CHECK(b->count == 3);
    CHECK(b->array_integer(0) == 1);
    CHECK(b->array_integer(1) == 0);
    CHECK(f.get_strings("t.a_str") == std::vector<std::string>{"<unk>", "", "a b"});
    const auto* n = f.find("t.nested");
    REQUIRE(n);
    CHECK(n->elem_type == gguf_type::array);
    REQUIRE(n->arrays.size() == 3);
    CHECK(n->arrays[0].elem_type == gguf_type::u8);
    CHECK(n->arrays[0].array_integer(1) == 2);
    CHECK(n->arrays[1].strings == std::vector<std::string>{"x"});
    REQUIRE(n->arrays[2].arrays.size() == 1);
    CHECK(n->arrays[2].arrays[0].elem_type == gguf_type::boolean);
    CHECK(n->arrays[2].arrays[0].count == 1);
  }

  TEST_CASE("tensors are laid out aligned and read back intact") {
    for (uint32_t alignment : {32u, 64u, 8u, 4096u}) {
      CAPTURE(alignment);
      gguf_writer w;
      if (alignment != 32) w.set_alignment(alignment);
      w.set("general.architecture", gguf_out_value::string("llama"));
      std::vector<float> a(3 * 5), c(7);
      for (size_t k = 0; k < a.size(); ++k) a[k] = static_cast<float>(k) - 4.5f;
      for (size_t k = 0; k < c.size(); ++k) c[k] = 100.0f + static_cast<float>(k);
      w.add_tensor("a", {3, 5}, weight_type::f32, bytes_of(a));
      // A streamed tensor: filled while writing, with exactly its byte size.
      size_t seen = 0;
      w.add_tensor("b", {64, 2}, weight_type::q8_0, [&](std::span<std::byte> out) {
        seen = out.size();
        for (size_t k = 0; k < out.size(); ++k) out[k] = std::byte(k & 0x7f);
      });
      w.add_tensor("c", {7}, weight_type::f32, bytes_of(c));
      CHECK(w.tensor_count() == 3);
      const auto layout = w.layout();
      const auto bytes = w.to_bytes();
      CHECK(seen == 2 * 2 * 34);
      CHECK(bytes.size() == layout.file_size);
      CHECK(layout.data_offset % alignment == 0);

      test::scratch_dir dir;
      const auto path = (dir / "t.gguf").string();
      w.write(path);
      CHECK(test::read_file(path).size() == bytes.size());
      CHECK(std::memcmp(test::read_file(path).data(), bytes.data(), bytes.size()) == 0);
      CHECK_FALSE(std::filesystem::exists(path + ".tmp"));

      models::gguf_file f(path);
      CHECK(f.alignment() == alignment);
      CHECK(f.data_offset() == layout.data_offset);
      REQUIRE(f.tensors().size() == 3);
      for (const auto& t : f.tensors()) {
        CAPTURE(t.name);
        CHECK(t.offset % alignment == 0);
        CHECK(f.data_offset() + t.offset == layout.tensor(t.name).data_offset);
      }
      const auto& ta = f.tensor("a");
      CHECK(ta.ne == std::vector<int64_t>{3, 5});
      CHECK(ta.type == weight_type::f32);
      CHECK(std::memcmp(ta.data.data(), a.data(), ta.bytes) == 0);
      const auto& tb = f.tensor("b");
      CHECK(tb.type == weight_type::q8_0);
      CHECK(tb.bytes == 136);
      CHECK(static_cast<int>(tb.data[100]) == 100);
      const auto& tc = f.tensor("c");
      CHECK(std::memcmp(tc.data.data(), c.data(), tc.bytes) == 0);
      // Padding between tensors is zero.
      const auto& la = layout.tensor("a");
      for (uint64_t k = la.data_offset + la.bytes; k < layout.tensor("b").data_offset; ++k) CHECK(bytes[k] == std::byte{0});
    }
  }

  TEST_CASE("the layout points at the fields it names") {
    gguf_writer w;
    w.set("k.one", gguf_out_value::u32(0xAABBCCDD));
    w.add_tensor("w", {32, 3}, weight_type::f16, std::vector<std::byte>(32 * 3 * 2));
    const auto l = w.layout();
    const auto bytes = w.to_bytes();
    auto u32_at = [&](uint64_t off) {
      uint32_t v;
      std::memcpy(&v, bytes.data() + off, 4);
      return v;
    };
    auto u64_at = [&](uint64_t off) {
      uint64_t v;
      std::memcpy(&v, bytes.data() + off, 8);
      return v;
    };
    CHECK(u64_at(l.tensor_count_offset) == 1);
    CHECK(u64_at(l.kv_count_offset) == 1);
    const auto& kv = l.kv("k.one");
    CHECK(u64_at(kv.key_offset) == 5);
    CHECK(u32_at(kv.type_offset) == static_cast<uint32_t>(gguf_type::u32));
    CHECK(u32_at(kv.value_offset) == 0xAABBCCDD);
    CHECK(kv.end == kv.value_offset + 4);
    const auto& t = l.tensor("w");
    CHECK(t.info_offset == kv.end);
    CHECK(u64_at(t.info_offset) == 1);
    CHECK(u32_at(t.n_dims_offset) == 2);
    CHECK(u64_at(t.ne_offset) == 32);
    CHECK(u64_at(t.ne_offset + 8) == 3);
    CHECK(u32_at(t.type_offset) == static_cast<uint32_t>(weight_type::f16));
    CHECK(u64_at(t.offset_offset) == 0);
    CHECK(l.header_end == t.offset_offset + 8);
    CHECK(t.data_offset == l.data_offset);
    CHECK(l.file_size == l.data_offset + 192);
    CHECK_THROWS_AS(l.kv("nope"), std::out_of_range);
    CHECK_THROWS_AS(l.tensor("nope"), std::out_of_range);
  }

  TEST_CASE("version 2 files") {
    gguf_writer w(2);
    w.set("a", gguf_out_value::string("b"));
    test::scratch_dir dir;
    const auto path = save(dir, "v2.gguf", w.to_bytes());
    models::gguf_file f(path);
    CHECK(f.version() == 2);
    CHECK(f.get_string("a") == "b");
    CHECK(f.tensors().empty());
  }

  TEST_CASE("setting a key again replaces its value in place") {
    gguf_writer w;
    w.set("x", gguf_out_value::u32(1));
    w.set("y", gguf_out_value::u32(2));
    w.set("x", gguf_out_value::string("three"));
    CHECK(w.has("x"));
    CHECK_FALSE(w.has("z"));
    test::scratch_dir dir;
    models::gguf_file f(save(dir, "r.gguf", w.to_bytes()));
    REQUIRE(f.metadata().size() == 2);
    CHECK(f.metadata()[0].key == "x");
    CHECK(f.get_string("x") == "three");
  }

  TEST_CASE("values copied from a file are written back unchanged") {
    models::gguf_file src(test::data_path("stories260K.gguf").string());
    gguf_writer w;
    for (const auto& kv : src.metadata())
      if (kv.key != "general.alignment") w.set(kv.key, gguf_out_value::from(kv.value));
    test::scratch_dir dir;
    models::gguf_file f(save(dir, "copy.gguf", w.to_bytes()));
    REQUIRE(f.metadata().size() == src.metadata().size());
    for (const auto& kv : src.metadata()) {
      CAPTURE(kv.key);
      const auto* v = f.find(kv.key);
      REQUIRE(v);
      CHECK(v->type == kv.value.type);
      CHECK(v->u == kv.value.u);
      CHECK(v->i == kv.value.i);
      CHECK(v->f == kv.value.f);
      CHECK(v->str == kv.value.str);
      CHECK(v->count == kv.value.count);
      CHECK(v->strings == kv.value.strings);
      CHECK(std::equal(v->raw.begin(), v->raw.end(), kv.value.raw.begin(), kv.value.raw.end()));
    }
    CHECK(f.get_strings("tokenizer.ggml.tokens")->size() == 512);
  }

  TEST_CASE("invalid requests are refused with the name of the thing") {
    CHECK_THROWS_AS(gguf_writer(1), std::invalid_argument);
    CHECK_THROWS_AS(gguf_writer(4), std::invalid_argument);
    gguf_writer w;
    CHECK_THROWS_AS(w.set("", gguf_out_value::u8(0)), std::invalid_argument);
    CHECK_THROWS_AS(w.set("general.alignment", gguf_out_value::u32(64)), std::invalid_argument);
    CHECK_THROWS_AS(w.set_alignment(12), std::invalid_argument);
    CHECK_THROWS_AS(w.set_alignment(0), std::invalid_argument);
    CHECK_THROWS_AS(w.set_alignment(1u << 21), std::invalid_argument);
    CHECK_THROWS_AS(gguf_out_value::arrays({gguf_out_value::u8(1)}), std::invalid_argument);
    w.add_tensor("t", {32}, weight_type::f32, std::vector<std::byte>(128));
    CHECK_THROWS_WITH_AS(w.add_tensor("t", {32}, weight_type::f32, std::vector<std::byte>(128)), doctest::Contains("'t'"), std::invalid_argument);
    CHECK_THROWS_WITH_AS(w.add_tensor("q", {33}, weight_type::q8_0, std::vector<std::byte>(34)), doctest::Contains("block size 32"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(w.add_tensor("s", {32}, weight_type::f32, std::vector<std::byte>(100)), doctest::Contains("'s'"), std::invalid_argument);
    CHECK_THROWS_AS(w.add_tensor("z", {32, 0}, weight_type::f32, std::vector<std::byte>()), std::invalid_argument);
    CHECK_THROWS_AS(w.add_tensor("d", {}, weight_type::f32, std::vector<std::byte>()), std::invalid_argument);
    CHECK_THROWS_AS(w.add_tensor("d", {1, 1, 1, 1, 1}, weight_type::f32, std::vector<std::byte>(4)), std::invalid_argument);
    CHECK_THROWS_AS(w.add_tensor("o", {1ll << 40, 1ll << 40}, weight_type::f32, gguf_writer::tensor_fill([](auto) {})), std::invalid_argument);
    CHECK(w.tensor_count() == 1);  // refused tensors leave nothing behind
  }

  TEST_CASE("a failing tensor source leaves no file behind") {
    gguf_writer w;
    w.add_tensor("t", {32}, weight_type::f32, [](std::span<std::byte>) { throw std::runtime_error("source failed"); });
    test::scratch_dir dir;
    const auto path = (dir / "x.gguf").string();
    CHECK_THROWS_WITH(w.write(path), "source failed");
    CHECK_FALSE(std::filesystem::exists(path));
    CHECK_FALSE(std::filesystem::exists(path + ".tmp"));
  }
}
