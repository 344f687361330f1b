// GGUF (versions 2 and 3) reader: metadata, tensor table and zero-copy views of tensor data.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "kernels/weight_type.h"
#include "memory/mapped_file.h"

namespace tandem::models {

// Metadata value types, numbered as in the GGUF spec.
enum class gguf_type : uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};
std::string_view gguf_type_name(gguf_type t);
// Bytes of one scalar of type t in the file; 0 for string and array.
size_t gguf_scalar_size(gguf_type t);

// Thrown for malformed files; what() names the file, the byte offset and the key or tensor.
struct gguf_error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Limits on metadata, the array ones totalled over the whole file. Each is checked against a
// declared count before anything is read or reserved for it, so with the defaults no file can
// make the reader hold more than ~16 MiB of keys, ~10 MiB of nested-array nodes or 128 MiB of
// string headers, whatever its size (memory that would otherwise grow 4 to 15 times faster
// than the file). Real models stay far below: a few hundred keys, vocabularies of at most
// 2^18 tokens plus as many merges, nested arrays rarely if ever. Tests lower them to exercise
// the checks cheaply.
struct gguf_limits {
  uint64_t metadata_keys = 1ull << 16;    // key-value pairs (~250 bytes each in memory)
  uint64_t array_elements = 1ull << 26;   // every element of every array (numbers included)
  uint64_t string_elements = 1ull << 22;  // elements of string arrays (32 bytes each)
  uint64_t nested_arrays = 1ull << 16;    // elements of arrays of arrays (~150 bytes each)
};

// One metadata value. Scalars fill exactly one of u/i/f/b/str (by `type`). Arrays keep
// numeric and bool elements as raw little-endian bytes inside the file mapping (no copy, so a
// huge declared array cannot amplify memory), string elements in `strings`, nested arrays in
// `arrays`.
struct gguf_value {
  gguf_type type = gguf_type::u8;
  uint64_t u = 0;                       // u8/u16/u32/u64
  int64_t i = 0;                        // i8/i16/i32/i64
  double f = 0;                         // f32/f64
  bool b = false;                       // boolean
  std::string str;                      // string
  gguf_type elem_type = gguf_type::u8;  // arrays only
  uint64_t count = 0;                   // arrays only: number of elements
  std::span<const std::byte> raw;       // numeric/bool array elements
  std::vector<std::string> strings;     // string array elements
  std::vector<gguf_value> arrays;       // nested array elements

  bool is_integer() const;
  bool is_float() const { return type == gguf_type::f32 || type == gguf_type::f64; }
  // Element k of a numeric array converted to double / int64 (caller checks k < count).
  // array_integer saturates: floats are truncated and clamped to the int64 range (NaN gives
  // 0), u64 values past int64 give INT64_MAX.
  double array_number(uint64_t k) const;
  int64_t array_integer(uint64_t k) const;
};

struct gguf_kv {
  std::string key;
  gguf_value value;
  uint64_t offset = 0;  // file offset of the key, for error messages
};

struct gguf_tensor {
  std::string name;
  std::vector<int64_t> ne;  // ggml order: ne[0] is the contiguous dimension
  kernels::weight_type type{};
  uint64_t offset = 0;              // relative to the start of the data section
  uint64_t bytes = 0;               // size of the tensor's data
  std::span<const std::byte> data;  // view into the mapping
  int64_t elements() const;
  int64_t rows() const { return ne.empty() ? 0 : elements() / ne[0]; }
};

// A parsed GGUF file. Everything is validated when the file is opened: every count, length,
// offset and size is checked against the file before it is used. Views (tensor data, raw
// arrays) stay valid as long as the gguf_file lives. Move-only (the mapping is); lookups by
// key or tensor name are hashed.
class gguf_file {
 public:
  // Maps and parses the file. Throws gguf_error (malformed, or past `limits`) or
  // std::runtime_error (I/O).
  explicit gguf_file(const std::string& path, const gguf_limits& limits = {});

  const std::string& path() const { return map_.path(); }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }
  size_t file_size() const { return map_.size(); }
  // Lets the kernel reclaim the mapped pages of a tensor's data that the caller has copied
  // (see memory::mapped_file::drop_pages); the data stays readable.
  void drop_pages(std::span<const std::byte> data) const noexcept { map_.drop_pages(data); }
  const std::vector<gguf_kv>& metadata() const { return kvs_; }
  const std::vector<gguf_tensor>& tensors() const { return tensors_; }

  const gguf_value* find(std::string_view key) const;
  const gguf_tensor* find_tensor(std::string_view name) const;
  // Tensor that must exist; throws gguf_error naming the file and tensor otherwise.
  const gguf_tensor& tensor(std::string_view name) const;

  // Typed getters: nullopt / empty when the key is absent; gguf_error when it has the wrong
  // type (integers of any width are accepted where an integer is asked for, in range).
  // get_floats refuses f64 elements beyond the float range (non-finite values pass through);
  // get_ints refuses float arrays and u64 elements beyond int64.
  std::optional<std::string> get_string(std::string_view key) const;
  std::optional<int64_t> get_int(std::string_view key) const;
  std::optional<double> get_float(std::string_view key) const;  // also accepts integers
  std::optional<bool> get_bool(std::string_view key) const;
  std::optional<std::vector<std::string>> get_strings(std::string_view key) const;
  std::optional<std::vector<float>> get_floats(std::string_view key) const;
  std::optional<std::vector<int64_t>> get_ints(std::string_view key) const;

  // Builds an error message "PATH: KEY: what".
  [[noreturn]] void fail_key(std::string_view key, const std::string& what) const;

 private:
  memory::mapped_file map_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<gguf_kv> kvs_;
  std::vector<gguf_tensor> tensors_;
  // Name → index. The keys view the names stored in kvs_ / tensors_: both vectors are filled
  // within their reserved capacity and never change afterwards, and a move carries their
  // buffers (and so the viewed strings) along unchanged.
  std::unordered_map<std::string_view, size_t> kv_index_;
  std::unordered_map<std::string_view, size_t> tensor_index_;
};

}  // namespace tandem::models
