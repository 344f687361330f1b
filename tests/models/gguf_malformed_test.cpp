// A corpus of malformed GGUF files, built in the test by patching or truncating a valid file
// from gguf_writer: each must be refused with a gguf_error naming the file, the offset and the
// key or tensor, without crashing or allocating what the file claims.
#include "models/gguf_reader.h"

#include <doctest/doctest.h>

#include <cstring>
#include <fstream>
#include <initializer_list>

#include "models/gguf_writer.h"
#include "tests/test_support.h"

using namespace tandem;
using kernels::weight_type;
using models::gguf_error;
using models::gguf_out_value;
using models::gguf_writer;

namespace {

constexpr uint64_t k_2_60 = 1ull << 60;
constexpr uint64_t k_2_62 = 1ull << 62;
constexpr uint64_t k_2_63 = 1ull << 63;

// The valid file every case starts from. Tensor data is arbitrary but fixed.
gguf_writer base_writer() {
  gguf_writer w;
  w.set_alignment(32);                                                   // kv #0
  w.set("general.architecture", gguf_out_value::string("llama"));        // #1
  w.set("general.name", gguf_out_value::string("malformed-test-base"));  // #2
  w.set("test.u32", gguf_out_value::u32(7));                             // #3
  w.set("test.flag", gguf_out_value::boolean(true));                     // #4
  w.set("test.tokens", gguf_out_value::strings({"<unk>", "<s>", "</s>", "hello", "world"}));
  w.set("test.bytes", gguf_out_value::array(std::vector<uint8_t>{1, 2, 3, 4}));  // #6
  w.set("test.bools", gguf_out_value::bools({true, false}));                     // #7
  w.set("test.nested", gguf_out_value::arrays({gguf_out_value::array(std::vector<int32_t>{1, 2}), gguf_out_value::strings({"a", "b"})}));
  w.set("test.f64", gguf_out_value::f64(0.125));  // #9
  auto pattern = [](std::span<std::byte> out) {
    for (size_t k = 0; k < out.size(); ++k) out[k] = std::byte((k * 37 + 11) & 0x3f);
  };
  w.add_tensor("tok.f32", {8, 2}, weight_type::f32, pattern);   // 64 bytes at data offset 0
  w.add_tensor("blk.q8", {32, 2}, weight_type::q8_0, pattern);  // 68 bytes at 64
  w.add_tensor("norm.f32", {16}, weight_type::f32, pattern);    // 64 bytes at 160
  w.add_tensor("emb.f16", {16, 3}, weight_type::f16, pattern);  // 96 bytes at 224
  return w;
}

struct fixture {
  test::scratch_dir dir;
  gguf_writer writer = base_writer();
  models::gguf_layout l = writer.layout();
  std::vector<std::byte> base = writer.to_bytes();
  int files = 0;

  template <typename T>
  std::vector<std::byte> patched(uint64_t offset, T v) const {
    auto b = base;
    REQUIRE(offset + sizeof(T) <= b.size());
    std::memcpy(b.data() + offset, &v, sizeof(T));
    return b;
  }
  std::vector<std::byte> cut(uint64_t size) const { return {base.begin(), base.begin() + static_cast<std::ptrdiff_t>(size)}; }

  std::string save(const std::vector<std::byte>& bytes) {
    const auto p = (dir / ("case" + std::to_string(files++) + ".gguf")).string();
    std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
    return p;
  }

  // The file must be refused with a gguf_error whose message names the file, "offset N" and
  // every one of `parts` (the key or tensor, and what is wrong).
  void refused(const std::vector<std::byte>& bytes, uint64_t offset, std::initializer_list<std::string> parts,
               const models::gguf_limits& limits = {}) {
    const auto path = save(bytes);
    std::string msg;
    try {
      models::gguf_file f(path, limits);
      FAIL("parsed a malformed file; expected an error at offset ", offset);
      return;
    } catch (const gguf_error& e) {
      msg = e.what();
    } catch (const std::exception& e) {
      FAIL("wrong exception type: ", e.what());
      return;
    }
    INFO("message: ", msg);
    CHECK(msg.find(path) == 0);
    CHECK(msg.find("offset " + std::to_string(offset) + ": ") != std::string::npos);
    for (const auto& p : parts) {
      INFO("expected part: ", p);
      CHECK(msg.find(p) != std::string::npos);
    }
  }
};

}  // namespace

TEST_SUITE("gguf_malformed") {
  TEST_CASE("the base file is valid") {
    fixture fx;
    models::gguf_file f(fx.save(fx.base));
    CHECK(f.metadata().size() == 10);
    CHECK(f.tensors().size() == 4);
    CHECK(fx.l.tensor("emb.f16").data_offset == fx.l.data_offset + 224);
  }

  TEST_CASE("header: magic and version") {
    fixture fx;
    SUBCASE("bad magic") { fx.refused(fx.patched<uint32_t>(0, 0x4C554747), 0, {"bad magic"}); }
    SUBCASE("empty file") { fx.refused({}, 0, {"magic"}); }
    SUBCASE("version 1") { fx.refused(fx.patched<uint32_t>(4, 1), 4, {"version 1"}); }
    SUBCASE("version 99") { fx.refused(fx.patched<uint32_t>(4, 99), 4, {"version 99"}); }
    SUBCASE("big-endian version 3") { fx.refused(fx.patched<uint32_t>(4, 0x03000000), 4, {"version 50331648"}); }
  }

  TEST_CASE("truncated at a dozen places") {
    fixture fx;
    const auto& l = fx.l;
    const auto& f64 = l.kv("test.f64");
    const auto& tokens = l.kv("test.tokens");
    const auto& nested = l.kv("test.nested");
    const auto& q8 = l.tensor("blk.q8");
    const auto& emb = l.tensor("emb.f16");
    struct cut_case {
      uint64_t size;      // bytes kept
      uint64_t offset;    // offset the error must name
      std::string thing;  // what it must name
    };
    const std::vector<cut_case> cases = {
        {2, 0, "magic"},
        {6, 4, "version"},
        {12, 8, "tensor count"},
        {20, 16, "metadata count"},
        {24, 16, "metadata count"},  // counts the rest of the file cannot hold
        {f64.key_offset + 4, f64.key_offset, "metadata key #9"},
        {f64.key_offset + 11, f64.key_offset + 8, "metadata key #9"},
        {f64.type_offset + 2, f64.type_offset, "key 'test.f64'"},
        {f64.value_offset + 5, f64.value_offset, "key 'test.f64'"},
        {tokens.end - 2, tokens.end - 5, "key 'test.tokens'[4]"},
        {nested.end - 1, nested.end - 1, "key 'test.nested'[1][1]"},
        {q8.info_offset + 5, q8.info_offset, "tensor info #1"},
        {q8.info_offset + 10, q8.info_offset + 8, "tensor info #1"},
        {q8.n_dims_offset + 1, q8.n_dims_offset, "tensor 'blk.q8'"},
        {q8.ne_offset + 11, q8.ne_offset + 8, "tensor 'blk.q8'"},
        {q8.type_offset + 1, q8.type_offset, "tensor 'blk.q8'"},
        {q8.offset_offset + 4, q8.offset_offset, "tensor 'blk.q8'"},
        {l.header_end, l.data_offset, "tensor 'tok.f32'"},  // cut before the data section
        {q8.data_offset + 10, q8.data_offset, "tensor 'blk.q8'"},
        {l.file_size - 1, emb.data_offset, "tensor 'emb.f16'"},
    };
    for (const auto& c : cases) {
      CAPTURE(c.size);
      CAPTURE(c.thing);
      fx.refused(fx.cut(c.size), c.offset, {c.thing});
    }
  }

  TEST_CASE("string lengths past the end of the file") {
    fixture fx;
    const auto& l = fx.l;
    SUBCASE("key length beyond the key limit") {
      fx.refused(fx.patched<uint64_t>(l.kv("test.u32").key_offset, 1ull << 40), l.kv("test.u32").key_offset,
                 {"metadata key #3", "exceeds the limit"});
    }
    SUBCASE("key length past EOF") {
      const auto& kv = l.kv("test.f64");
      fx.refused(fx.patched<uint64_t>(kv.key_offset, 60000), kv.key_offset + 8, {"metadata key #9", "60000"});
    }
    SUBCASE("string value 2^63 long") {
      const auto& kv = l.kv("general.name");
      fx.refused(fx.patched<uint64_t>(kv.value_offset, k_2_63), kv.value_offset + 8, {"key 'general.name'", "remain"});
    }
    SUBCASE("string array element 2^50 long") {
      // Elements: "<unk>" (8+5), "<s>" (8+3), then "</s>".
      const auto& kv = l.kv("test.tokens");
      const uint64_t elem2 = kv.value_offset + 12 + 13 + 11;
      fx.refused(fx.patched<uint64_t>(elem2, 1ull << 50), elem2 + 8, {"key 'test.tokens'[2]"});
    }
    SUBCASE("tensor name past EOF") {
      const auto& t = l.tensor("blk.q8");
      fx.refused(fx.patched<uint64_t>(t.info_offset, 65000), t.info_offset + 8, {"tensor info #1 (name"});
    }
    SUBCASE("tensor name beyond the limit") {
      const auto& t = l.tensor("blk.q8");
      fx.refused(fx.patched<uint64_t>(t.info_offset, ~0ull), t.info_offset, {"tensor info #1", "exceeds the limit"});
    }
    SUBCASE("empty key") {
      fx.refused(fx.patched<uint64_t>(l.kv("general.name").key_offset, 0), l.kv("general.name").key_offset, {"metadata key #2 is empty"});
    }
  }

  TEST_CASE("absurd counts are refused before anything is allocated") {
    fixture fx;
    const auto& l = fx.l;
    SUBCASE("metadata count 2^60") { fx.refused(fx.patched<uint64_t>(l.kv_count_offset, k_2_60), 16, {"metadata count " + std::to_string(k_2_60)}); }
    SUBCASE("tensor count 2^63") { fx.refused(fx.patched<uint64_t>(l.tensor_count_offset, k_2_63), 8, {"tensor count " + std::to_string(k_2_63)}); }
    SUBCASE("more keys than the limit, though the file holds them") {
      CHECK_NOTHROW(models::gguf_file(fx.save(fx.base), {.metadata_keys = 10}));
      fx.refused(fx.base, 16, {"metadata count 10 exceeds the limit of 9"}, {.metadata_keys = 9});
    }
    SUBCASE("tensor count just past what the file holds") {
      fx.refused(fx.patched<uint64_t>(l.tensor_count_offset, fx.base.size() / 24 + 1), 8, {"tensor count"});
    }
    SUBCASE("string array count 2^62") {
      const auto& kv = l.kv("test.tokens");
      fx.refused(fx.patched<uint64_t>(kv.value_offset + 4, k_2_62), kv.value_offset,
                 {"key 'test.tokens'", "array of " + std::to_string(k_2_62) + " elements"});
    }
    SUBCASE("u8 array count 2^62") {
      const auto& kv = l.kv("test.bytes");
      fx.refused(fx.patched<uint64_t>(kv.value_offset + 4, k_2_62), kv.value_offset, {"key 'test.bytes'", "cannot fit"});
    }
    SUBCASE("u8 array count 2^64-1") {
      const auto& kv = l.kv("test.bytes");
      fx.refused(fx.patched<uint64_t>(kv.value_offset + 4, ~0ull), kv.value_offset, {"key 'test.bytes'", "cannot fit"});
    }
    SUBCASE("array of arrays count 2^62") {
      const auto& kv = l.kv("test.nested");
      fx.refused(fx.patched<uint64_t>(kv.value_offset + 4, k_2_62), kv.value_offset, {"key 'test.nested'", "cannot fit"});
    }
    SUBCASE("inner array count 2^62") {
      const auto& kv = l.kv("test.nested");
      fx.refused(fx.patched<uint64_t>(kv.value_offset + 16, k_2_62), kv.value_offset + 12, {"key 'test.nested'[0]", "cannot fit"});
    }
  }

  TEST_CASE("bad value types and values") {
    fixture fx;
    const auto& l = fx.l;
    SUBCASE("unknown value type 13") {
      const auto& kv = l.kv("test.u32");
      fx.refused(fx.patched<uint32_t>(kv.type_offset, 13), kv.type_offset, {"key 'test.u32'", "unknown value type 13"});
    }
    SUBCASE("unknown value type 2^32-1") {
      const auto& kv = l.kv("test.u32");
      fx.refused(fx.patched<uint32_t>(kv.type_offset, ~0u), kv.type_offset, {"key 'test.u32'", "unknown value type"});
    }
    SUBCASE("unknown array element type") {
      const auto& kv = l.kv("test.bytes");
      fx.refused(fx.patched<uint32_t>(kv.value_offset, 99), kv.value_offset, {"key 'test.bytes'", "unknown array element type 99"});
    }
    SUBCASE("bool value 2") {
      const auto& kv = l.kv("test.flag");
      fx.refused(fx.patched<uint8_t>(kv.value_offset, 2), kv.value_offset, {"key 'test.flag'", "neither 0 nor 1"});
    }
    SUBCASE("bool array element 7") {
      const auto& kv = l.kv("test.bools");
      fx.refused(fx.patched<uint8_t>(kv.value_offset + 13, 7), kv.value_offset + 13, {"key 'test.bools'[1]", "neither 0 nor 1"});
    }
    SUBCASE("duplicate key") {
      // "test.f64" becomes "test.u32" (same length), which came earlier.
      const auto& kv = l.kv("test.f64");
      auto b = fx.base;
      std::memcpy(b.data() + kv.key_offset + 8, "test.u32", 8);
      fx.refused(b, kv.key_offset, {"duplicate metadata key 'test.u32'"});
    }
  }

  TEST_CASE("bad general.alignment") {
    fixture fx;
    const auto& kv = fx.l.kv("general.alignment");
    SUBCASE("values that are not a multiple of 8 up to 1 MiB") {
      for (uint32_t a : {0u, 7u, 12u, 1u << 21}) {
        CAPTURE(a);
        fx.refused(fx.patched<uint32_t>(kv.value_offset, a), kv.key_offset, {"key 'general.alignment'", "multiple of 8"});
      }
    }
    SUBCASE("alignment stored as i32") { fx.refused(fx.patched<uint32_t>(kv.type_offset, 5), kv.key_offset, {"key 'general.alignment'", "u32"}); }
    SUBCASE("a valid alignment of 64 that the tensor offsets do not honour") {
      const auto& t = fx.l.tensor("norm.f32");
      fx.refused(fx.patched<uint32_t>(kv.value_offset, 64), t.offset_offset, {"tensor 'norm.f32'", "alignment 64"});
    }
  }

  TEST_CASE("deep nesting") {
    // Levels of arrays: the reader accepts 8 and refuses more, before descending further.
    auto nested = [](int levels) {
      auto v = gguf_out_value::array(std::vector<uint8_t>{1});
      for (int k = 1; k < levels; ++k) v = gguf_out_value::arrays({v});
      gguf_writer w;
      w.set("general.architecture", gguf_out_value::string("llama"));
      w.set("deep", v);
      return w;
    };
    fixture fx;
    {
      models::gguf_file ok(fx.save(nested(8).to_bytes()));
      CHECK(ok.find("deep")->arrays.size() == 1);
    }
    for (int levels : {9, 100}) {
      CAPTURE(levels);
      auto w = nested(levels);
      const auto layout = w.layout();
      const auto& kv = layout.kv("deep");
      fx.refused(w.to_bytes(), kv.value_offset + 8 * 12, {"key 'deep'[0][0][0][0][0][0][0][0]", "nested deeper than 8"});
    }
  }

  TEST_CASE("array totals over the whole file are capped before anything is reserved") {
    fixture fx;
    const auto& nested = fx.l.kv("test.nested");
    // test.nested is [[1, 2] (i32), ["a", "b"]]; its second element's header follows the
    // 12-byte outer header and the 20-byte first element.
    const uint64_t nested1 = nested.value_offset + 12 + 20;
    // The base file holds 5 + 4 + 2 + 2 + 2 + 2 = 17 array elements, 7 of them strings and 2
    // nested arrays: each limit passes at exactly that total and fails one below, at the
    // array that crosses it.
    SUBCASE("all elements") {
      CHECK_NOTHROW(models::gguf_file(fx.save(fx.base), {.array_elements = 17}));
      fx.refused(fx.base, nested1, {"key 'test.nested'[1]", "total of array elements", "limit of 16"}, {.array_elements = 16});
    }
    SUBCASE("string elements, counted across keys") {
      CHECK_NOTHROW(models::gguf_file(fx.save(fx.base), {.string_elements = 7}));
      fx.refused(fx.base, nested1, {"key 'test.nested'[1]", "total of string array elements", "limit of 6"}, {.string_elements = 6});
      fx.refused(fx.base, fx.l.kv("test.tokens").value_offset, {"key 'test.tokens'", "limit of 4"}, {.string_elements = 4});
    }
    SUBCASE("nested arrays") {
      CHECK_NOTHROW(models::gguf_file(fx.save(fx.base), {.nested_arrays = 2}));
      fx.refused(fx.base, nested.value_offset, {"key 'test.nested'", "total of nested arrays", "limit of 1"}, {.nested_arrays = 1});
    }
    SUBCASE("nested arrays spread over levels and keys, at the default limit") {
      // Key "a": 2^15 empty arrays; key "b": an array of 2 arrays of 2^14 empty arrays each,
      // which reaches 2^15 + 2 + 2^14 + 2^14 = 2^16 + 2 nested arrays inside its second element.
      const uint64_t n = models::gguf_limits{}.nested_arrays;
      auto empties = [](uint64_t count) {
        return models::gguf_out_value::arrays(std::vector<gguf_out_value>(count, gguf_out_value::array(std::vector<uint8_t>{})));
      };
      gguf_writer w;
      w.set("a", empties(n / 2));
      w.set("b", gguf_out_value::arrays({empties(n / 4), empties(n / 4)}));
      const auto layout = w.layout();
      const auto& b = layout.kv("b");
      const uint64_t b1 = b.value_offset + 12 + (12 + n / 4 * 12);
      fx.refused(w.to_bytes(), b1, {"key 'b'[1]", "total of nested arrays", std::to_string(n + 2)});
      // Two fewer in "a" brings the total to exactly the limit, which parses.
      gguf_writer ok;
      ok.set("a", empties(n / 2 - 2));
      ok.set("b", gguf_out_value::arrays({empties(n / 4), empties(n / 4)}));
      models::gguf_file f(fx.save(ok.to_bytes()));
      CHECK(f.find("b")->arrays[1].arrays.size() == n / 4);
    }
  }

  TEST_CASE("bad tensor infos") {
    fixture fx;
    const auto& l = fx.l;
    const auto& q8 = l.tensor("blk.q8");
    SUBCASE("0 dimensions") { fx.refused(fx.patched<uint32_t>(q8.n_dims_offset, 0), q8.n_dims_offset, {"tensor 'blk.q8'", "0 dimensions"}); }
    SUBCASE("5 dimensions") { fx.refused(fx.patched<uint32_t>(q8.n_dims_offset, 5), q8.n_dims_offset, {"tensor 'blk.q8'", "5 dimensions"}); }
    SUBCASE("a zero dimension") { fx.refused(fx.patched<uint64_t>(q8.ne_offset + 8, 0), q8.ne_offset + 8, {"tensor 'blk.q8'", "dimension 1 is 0"}); }
    SUBCASE("a dimension past int64") {
      fx.refused(fx.patched<uint64_t>(q8.ne_offset, k_2_63), q8.ne_offset, {"tensor 'blk.q8'", "dimension 0 is " + std::to_string(k_2_63)});
    }
    SUBCASE("dimensions whose product overflows int64") {
      const auto& t = l.tensor("tok.f32");
      auto b = fx.patched<uint64_t>(t.ne_offset, 1ull << 32);
      const uint64_t big = 1ull << 32;
      std::memcpy(b.data() + t.ne_offset + 8, &big, 8);
      fx.refused(b, t.ne_offset + 8, {"tensor 'tok.f32'", "overflows"});
    }
    SUBCASE("a byte size that overflows uint64") {
      // 2^62 F32 elements is a valid element count but 2^64 bytes.
      const auto& t = l.tensor("norm.f32");
      fx.refused(fx.patched<uint64_t>(t.ne_offset, k_2_62), t.n_dims_offset, {"tensor 'norm.f32'", "byte size overflows"});
    }
    SUBCASE("huge but representable size") {
      const auto& t = l.tensor("norm.f32");
      fx.refused(fx.patched<uint64_t>(t.ne_offset, 1ull << 40), t.data_offset, {"tensor 'norm.f32'", "extends past the end"});
    }
    SUBCASE("removed type id 4") {
      fx.refused(fx.patched<uint32_t>(q8.type_offset, 4), q8.type_offset, {"tensor 'blk.q8'", "unknown tensor type 4"});
    }
    SUBCASE("type id 1000") {
      fx.refused(fx.patched<uint32_t>(q8.type_offset, 1000), q8.type_offset, {"tensor 'blk.q8'", "unknown tensor type 1000"});
    }
    SUBCASE("ne[0] not a multiple of the block size") {
      fx.refused(fx.patched<uint64_t>(q8.ne_offset, 33), q8.n_dims_offset, {"tensor 'blk.q8'", "33", "block size 32"});
    }
    SUBCASE("unaligned data offset") {
      const auto& t = l.tensor("emb.f16");
      fx.refused(fx.patched<uint64_t>(t.offset_offset, 224 + 8), t.offset_offset, {"tensor 'emb.f16'", "alignment 32"});
    }
    SUBCASE("data offset out of range") {
      const auto& t = l.tensor("emb.f16");
      fx.refused(fx.patched<uint64_t>(t.offset_offset, 1ull << 40), l.data_offset + (1ull << 40), {"tensor 'emb.f16'", "extends past the end"});
    }
    SUBCASE("data offset that would wrap") {
      const auto& t = l.tensor("emb.f16");
      fx.refused(fx.patched<uint64_t>(t.offset_offset, ~0ull - 31), l.file_size, {"tensor 'emb.f16'", "extends past the end"});
    }
    SUBCASE("data just one block past the end") {
      const auto& t = l.tensor("emb.f16");
      fx.refused(fx.patched<uint64_t>(t.offset_offset, 256), l.data_offset + 256, {"tensor 'emb.f16'", "extends past the end"});
    }
    SUBCASE("overlapping tensors") {
      // blk.q8 moved onto the second half of tok.f32 (64 bytes at 0).
      fx.refused(fx.patched<uint64_t>(q8.offset_offset, 32), l.data_offset + 32, {"tensor 'blk.q8' overlaps tensor 'tok.f32'"});
    }
    SUBCASE("two tensors at the same offset") {
      const auto& t = l.tensor("emb.f16");
      fx.refused(fx.patched<uint64_t>(t.offset_offset, 160), l.data_offset + 160, {"overlaps", "emb.f16", "norm.f32"});
    }
    SUBCASE("duplicate tensor name") {
      const auto& t = l.tensor("emb.f16");
      auto b = fx.base;
      std::memcpy(b.data() + t.info_offset + 8, "tok.f32", 7);
      fx.refused(b, t.info_offset, {"duplicate tensor 'tok.f32'"});
    }
  }

  TEST_CASE("random mutations parse or throw, never anything else") {
    fixture fx;
    uint64_t state = 0x5eed1234abcdull;
    auto next = [&] {  // splitmix64
      uint64_t z = (state += 0x9e3779b97f4a7c15ull);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      return z ^ (z >> 31);
    };
    const uint64_t size = fx.base.size();
    const uint64_t header = fx.l.header_end;
    const uint64_t interesting[] = {0, 1, 2, 0xff, 1ull << 31, 1ull << 32, k_2_62, k_2_63, ~0ull, size, size * 2};
    int parsed = 0, refused = 0;
    const auto path = (fx.dir / "mutant.gguf").string();
    for (int n = 0; n < 400; ++n) {
      auto b = fx.base;
      switch (next() % 4) {
        case 0:  // a few random bytes in the header
          for (uint64_t k = 0, m = 1 + next() % 4; k < m; ++k) b[next() % header] = std::byte(next() & 0xff);
          break;
        case 1: {  // an interesting 64-bit value anywhere in the header
          const uint64_t at = next() % (header - 8);
          const uint64_t v = interesting[next() % std::size(interesting)];
          std::memcpy(b.data() + at, &v, 8);
          break;
        }
        case 2:  // truncation
          b.resize(next() % size);
          break;
        default:  // a byte anywhere, data included
          b[next() % size] ^= std::byte(1 + next() % 255);
          break;
      }
      std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
      try {
        models::gguf_file f(path);
        // Touch everything the parse produced so the sanitizers see any bad view.
        unsigned sum = 0;
        for (const auto& t : f.tensors())
          for (auto x : t.data) sum += static_cast<unsigned>(x);
        for (const auto& kv : f.metadata())
          for (auto x : kv.value.raw) sum += static_cast<unsigned>(x);
        (void)sum;
        ++parsed;
      } catch (const std::runtime_error&) {  // gguf_error or I/O
        ++refused;
      } catch (const std::exception& e) {
        FAIL("mutant ", n, " threw ", e.what());
      }
    }
    CHECK(parsed + refused == 400);
    CHECK(parsed > 20);
    CHECK(refused > 100);
  }
}
