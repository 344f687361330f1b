// GGUF (v3, or v2 on request) writer: metadata of every value type, aligned tensor data,
// streamed to a file or returned as bytes (tests patch those bytes into malformed files).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <type_traits>
#include <vector>

#include "kernels/weight_type.h"
#include "models/gguf_reader.h"

namespace tandem::models {

// An owned metadata value, kept as the exact bytes that follow its type id in the file, so
// arrays of any depth are just concatenated payloads. Build one with the static makers.
class gguf_out_value {
 public:
  static gguf_out_value u8(uint8_t v) { return scalar(gguf_type::u8, v); }
  static gguf_out_value i8(int8_t v) { return scalar(gguf_type::i8, v); }
  static gguf_out_value u16(uint16_t v) { return scalar(gguf_type::u16, v); }
  static gguf_out_value i16(int16_t v) { return scalar(gguf_type::i16, v); }
  static gguf_out_value u32(uint32_t v) { return scalar(gguf_type::u32, v); }
  static gguf_out_value i32(int32_t v) { return scalar(gguf_type::i32, v); }
  static gguf_out_value u64(uint64_t v) { return scalar(gguf_type::u64, v); }
  static gguf_out_value i64(int64_t v) { return scalar(gguf_type::i64, v); }
  static gguf_out_value f32(float v) { return scalar(gguf_type::f32, v); }
  static gguf_out_value f64(double v) { return scalar(gguf_type::f64, v); }
  static gguf_out_value boolean(bool v) { return scalar(gguf_type::boolean, static_cast<uint8_t>(v ? 1 : 0)); }
  static gguf_out_value string(std::string_view s);

  // Array of numbers; the element type follows T (uint8_t → u8 … double → f64).
  template <typename T>
  static gguf_out_value array(std::span<const T> v) {
    static_assert(std::is_arithmetic_v<T> && !std::is_same_v<T, bool>, "use bools() for bool arrays");
    return raw_array(element_type<T>(), v.size(), std::as_bytes(v));
  }
  template <typename T>
  static gguf_out_value array(const std::vector<T>& v) {
    return array(std::span<const T>(v));
  }
  static gguf_out_value bools(const std::vector<bool>& v);
  static gguf_out_value strings(const std::vector<std::string>& v);
  // Array whose elements are arrays (each may have its own element type); every element
  // must itself be an array, else std::invalid_argument.
  static gguf_out_value arrays(const std::vector<gguf_out_value>& v);
  // Copy of a value read from a file, e.g. to carry tokenizer keys into a new file.
  static gguf_out_value from(const gguf_value& v);

  gguf_type type() const { return type_; }
  // Bytes written after the type id (for an array: element type, count, elements).
  std::span<const std::byte> payload() const { return payload_; }

 private:
  template <typename T>
  static gguf_out_value scalar(gguf_type t, T v) {
    gguf_out_value out;
    out.type_ = t;
    out.payload_.resize(sizeof(T));
    std::memcpy(out.payload_.data(), &v, sizeof(T));
    return out;
  }
  template <typename T>
  static constexpr gguf_type element_type() {
    if constexpr (std::is_same_v<T, float>)
      return gguf_type::f32;
    else if constexpr (std::is_same_v<T, double>)
      return gguf_type::f64;
    else if constexpr (std::is_signed_v<T> && sizeof(T) == 1)
      return gguf_type::i8;
    else if constexpr (std::is_signed_v<T> && sizeof(T) == 2)
      return gguf_type::i16;
    else if constexpr (std::is_signed_v<T> && sizeof(T) == 4)
      return gguf_type::i32;
    else if constexpr (std::is_signed_v<T> && sizeof(T) == 8)
      return gguf_type::i64;
    else if constexpr (sizeof(T) == 1)
      return gguf_type::u8;
    else if constexpr (sizeof(T) == 2)
      return gguf_type::u16;
    else if constexpr (sizeof(T) == 4)
      return gguf_type::u32;
    else
      return gguf_type::u64;
  }
  static gguf_out_value raw_array(gguf_type elem, uint64_t count, std::span<const std::byte> elems);

  gguf_type type_ = gguf_type::u8;
  std::vector<std::byte> payload_;
};

// Where each part of a file lies (absolute byte offsets), so tests can patch or truncate
// exactly the field they mean to break.
struct gguf_layout {
  struct kv_at {
    std::string key;
    uint64_t key_offset = 0;    // the key's string length field
    uint64_t type_offset = 0;   // the u32 value type
    uint64_t value_offset = 0;  // the value payload
    uint64_t end = 0;           // one past the value
  };
  struct tensor_at {
    std::string name;
    uint64_t info_offset = 0;    // the name's string length field
    uint64_t n_dims_offset = 0;  // u32 dimension count
    uint64_t ne_offset = 0;      // u64 ne[0]; ne[k] at ne_offset + 8k
    uint64_t type_offset = 0;    // u32 ggml type
    uint64_t offset_offset = 0;  // u64 data offset (relative to the data section)
    uint64_t data_offset = 0;    // absolute start of the tensor's bytes
    uint64_t bytes = 0;
  };
  uint64_t kv_count_offset = 16;
  uint64_t tensor_count_offset = 8;
  std::vector<kv_at> kvs;
  std::vector<tensor_at> tensors;
  uint64_t header_end = 0;   // end of the last tensor info
  uint64_t data_offset = 0;  // start of the (aligned) data section
  uint64_t file_size = 0;

  // Entry for a key / tensor; std::out_of_range when absent.
  const kv_at& kv(std::string_view key) const;
  const tensor_at& tensor(std::string_view name) const;
};

// Collects metadata and tensors, then writes them in one pass. Metadata keeps insertion
// order; setting a key again replaces its value in place, so a writer never produces
// duplicate keys. Everything it writes is valid GGUF: bad arguments throw
// std::invalid_argument naming the key or tensor.
class gguf_writer {
 public:
  // Fills `out` (exactly the tensor's byte size) while the file is being written, so a large
  // model never needs to be in memory all at once.
  using tensor_fill = std::function<void(std::span<std::byte> out)>;

  explicit gguf_writer(uint32_t version = 3);

  void set(std::string key, gguf_out_value value);
  // Sets general.alignment (u32, multiple of 8, at most 1 MiB); default alignment is 32.
  void set_alignment(uint32_t alignment);
  uint32_t alignment() const { return alignment_; }
  bool has(std::string_view key) const;

  // ne in ggml order (ne[0] contiguous), 1..4 dims each > 0, ne[0] a multiple of the type's
  // block size. The data overload checks data.size() against the computed size.
  void add_tensor(std::string name, std::vector<int64_t> ne, kernels::weight_type type, tensor_fill fill);
  void add_tensor(std::string name, std::vector<int64_t> ne, kernels::weight_type type, std::vector<std::byte> data);

  size_t tensor_count() const { return tensors_.size(); }
  gguf_layout layout() const;
  // The whole file in memory (tests); `write` streams it to `path` instead, through a
  // temporary file renamed into place only when complete.
  std::vector<std::byte> to_bytes() const;
  void write(const std::string& path) const;

 private:
  struct kv {
    std::string key;
    gguf_out_value value;
  };
  struct tensor {
    std::string name;
    std::vector<int64_t> ne;
    kernels::weight_type type;
    uint64_t bytes;
    tensor_fill fill;
  };
  // Sends the file, in order, to `sink(bytes)`.
  void emit(const std::function<void(std::span<const std::byte>)>& sink) const;

  uint32_t version_;
  uint32_t alignment_ = 32;
  std::vector<kv> kvs_;
  std::vector<tensor> tensors_;
};

}  // namespace tandem::models
