#include "models/gguf_reader.h"

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

namespace tandem::models {
namespace {

constexpr uint32_t k_magic = 0x46554747;  // "GGUF" read little-endian
constexpr int k_max_dims = 4;
constexpr int k_max_nesting = 8;        // arrays of arrays deeper than this are refused
constexpr uint64_t k_max_name = 65535;  // longest key or tensor name accepted

static_assert(std::endian::native == std::endian::little, "tandem reads GGUF on little-endian hosts");

// Names of the things being read are passed as callables (or plain strings) and turned into
// text only when an error is thrown: building "key 'k'[i]" for every element of a
// million-element array would cost an allocation each.
template <typename Name>
std::string describe(const Name& what) {
  if constexpr (std::is_convertible_v<const Name&, std::string_view>)
    return std::string(std::string_view(what));
  else
    return what();
}

// Bounds-checked reader over the mapping; every failure names the file and offset.
class cursor {
 public:
  cursor(std::span<const std::byte> bytes, const std::string& path) : bytes_(bytes), path_(path) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return bytes_.size() - pos_; }

  [[noreturn]] void fail(const std::string& what, uint64_t at) const { throw gguf_error(path_ + ": offset " + std::to_string(at) + ": " + what); }
  [[noreturn]] void fail(const std::string& what) const { fail(what, pos_); }

  template <typename Name>
  void need(uint64_t n, const Name& what) const {
    if (n > remaining())
      fail(describe(what) + ": needs " + std::to_string(n) + " bytes but only " + std::to_string(remaining()) + " remain in the file");
  }

  template <typename T, typename Name>
  T read(const Name& what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, bytes_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  template <typename Name>
  std::string read_string(const Name& what, uint64_t max_len = std::numeric_limits<uint64_t>::max()) {
    const uint64_t at = pos_;
    const auto len = read<uint64_t>([&] { return describe(what) + " (string length)"; });
    if (len > max_len) fail(describe(what) + ": string length " + std::to_string(len) + " exceeds the limit of " + std::to_string(max_len), at);
    need(len, [&] { return describe(what) + " (string of length " + std::to_string(len) + ")"; });
    std::string s(reinterpret_cast<const char*>(bytes_.data() + pos_), len);
    pos_ += len;
    return s;
  }

  template <typename Name>
  std::span<const std::byte> take(uint64_t n, const Name& what) {
    need(n, what);
    auto s = bytes_.subspan(pos_, n);
    pos_ += n;
    return s;
  }

 private:
  std::span<const std::byte> bytes_;
  const std::string& path_;
  uint64_t pos_ = 0;
};

bool valid_type(uint32_t t) { return t <= static_cast<uint32_t>(gguf_type::f64); }

// Reads metadata values, keeping the array totals of the whole file against gguf_limits and
// the index path of the element being read (for error messages only).
class value_reader {
 public:
  value_reader(cursor& c, const gguf_limits& limits) : c_(c), limits_(limits) {}

  void read(const std::string& key, gguf_type type, gguf_value& v) {
    key_ = &key;
    depth_ = 0;
    read_value(type, v);
  }

 private:
  // "key 'K'" followed by "[i]" for the first `levels` indices of the current path.
  std::string name(int levels) const {
    // Appended piece by piece: g++ 12 warns falsely (-Wrestrict) on "literal" + string&&.
    std::string s = "key '";
    s += *key_;
    s += '\'';
    for (int d = 0; d < levels; ++d) {
      s += '[';
      s += std::to_string(path_[d]);
      s += ']';
    }
    return s;
  }
  std::string name() const { return name(depth_); }

  void read_value(gguf_type type, gguf_value& v) {
    auto what = [this] { return name(); };
    v.type = type;
    switch (type) {
      case gguf_type::u8:
        v.u = c_.read<uint8_t>(what);
        break;
      case gguf_type::u16:
        v.u = c_.read<uint16_t>(what);
        break;
      case gguf_type::u32:
        v.u = c_.read<uint32_t>(what);
        break;
      case gguf_type::u64:
        v.u = c_.read<uint64_t>(what);
        break;
      case gguf_type::i8:
        v.i = c_.read<int8_t>(what);
        break;
      case gguf_type::i16:
        v.i = c_.read<int16_t>(what);
        break;
      case gguf_type::i32:
        v.i = c_.read<int32_t>(what);
        break;
      case gguf_type::i64:
        v.i = c_.read<int64_t>(what);
        break;
      case gguf_type::f32:
        v.f = c_.read<float>(what);
        break;
      case gguf_type::f64:
        v.f = c_.read<double>(what);
        break;
      case gguf_type::boolean: {
        const uint64_t at = c_.pos();
        const auto b = c_.read<uint8_t>(what);
        if (b > 1) c_.fail(name() + ": bool value " + std::to_string(b) + " is neither 0 nor 1", at);
        v.b = b != 0;
        break;
      }
      case gguf_type::string:
        v.str = c_.read_string(what);
        break;
      case gguf_type::array:
        read_array(v);
        break;
    }
  }

  // Adds `count` to one running total; the error names the array and its header offset.
  void charge(uint64_t& total, uint64_t count, uint64_t limit, const char* kind, uint64_t at) {
    total += count;  // counts are bounded by the file size, so this cannot wrap
    if (total > limit)
      c_.fail(name() + ": array of " + std::to_string(count) + " elements brings the file's " + kind + " to " + std::to_string(total) +
                  ", past the limit of " + std::to_string(limit),
              at);
  }

  void read_array(gguf_value& v) {
    if (depth_ >= k_max_nesting) c_.fail(name() + ": arrays nested deeper than " + std::to_string(k_max_nesting));
    const uint64_t at = c_.pos();
    const auto et = c_.read<uint32_t>([this] { return name() + " (array element type)"; });
    if (!valid_type(et)) c_.fail(name() + ": unknown array element type " + std::to_string(et), at);
    v.elem_type = static_cast<gguf_type>(et);
    v.count = c_.read<uint64_t>([this] { return name() + " (array length)"; });
    // Every element takes at least this many bytes, so a count the file cannot hold is refused
    // before anything is allocated for it.
    const uint64_t min_elem = v.elem_type == gguf_type::string ? 8 : v.elem_type == gguf_type::array ? 12 : gguf_scalar_size(v.elem_type);
    if (v.count > c_.remaining() / min_elem)
      c_.fail(name() + ": array of " + std::to_string(v.count) + " elements cannot fit in the " + std::to_string(c_.remaining()) +
                  " bytes left in the file",
              at);
    // Even counts the file can hold may cost far more memory than file bytes (a 12-byte empty
    // array becomes a ~150-byte gguf_value), so the totals are charged before anything is
    // reserved, and the reservations below are then bounded by the limits.
    charge(elements_, v.count, limits_.array_elements, "total of array elements", at);
    if (v.elem_type == gguf_type::string) {
      charge(strings_, v.count, limits_.string_elements, "total of string array elements", at);
      v.strings.reserve(v.count);
      for (uint64_t k = 0; k < v.count; ++k) {
        path_[depth_] = k;
        v.strings.push_back(c_.read_string([this] { return name(depth_ + 1); }));
      }
    } else if (v.elem_type == gguf_type::array) {
      charge(nested_, v.count, limits_.nested_arrays, "total of nested arrays", at);
      v.arrays.reserve(v.count);
      for (uint64_t k = 0; k < v.count; ++k) {
        auto& e = v.arrays.emplace_back();
        e.type = gguf_type::array;
        path_[depth_++] = k;
        read_array(e);
        --depth_;
      }
    } else {
      const uint64_t data_at = c_.pos();
      v.raw = c_.take(v.count * min_elem, [this] { return name() + " (array data)"; });
      if (v.elem_type == gguf_type::boolean)
        for (uint64_t k = 0; k < v.count; ++k)
          if (const auto b = static_cast<uint8_t>(v.raw[k]); b > 1) {
            path_[depth_] = k;
            c_.fail(name(depth_ + 1) + ": bool array element " + std::to_string(b) + " is neither 0 nor 1", data_at + k);
          }
    }
  }

  cursor& c_;
  const gguf_limits& limits_;
  const std::string* key_ = nullptr;
  uint64_t path_[k_max_nesting] = {};  // index at each level of nesting, outermost first
  int depth_ = 0;                      // levels of path_ in use
  uint64_t elements_ = 0;              // running totals over the whole file
  uint64_t strings_ = 0;
  uint64_t nested_ = 0;
};

}  // namespace

std::string_view gguf_type_name(gguf_type t) {
  switch (t) {
    case gguf_type::u8:
      return "u8";
    case gguf_type::i8:
      return "i8";
    case gguf_type::u16:
      return "u16";
    case gguf_type::i16:
      return "i16";
    case gguf_type::u32:
      return "u32";
    case gguf_type::i32:
      return "i32";
    case gguf_type::f32:
      return "f32";
    case gguf_type::boolean:
      return "bool";
    case gguf_type::string:
      return "string";
    case gguf_type::array:
      return "array";
    case gguf_type::u64:
      return "u64";
    case gguf_type::i64:
      return "i64";
    case gguf_type::f64:
      return "f64";
  }
  return "?";
}

size_t gguf_scalar_size(gguf_type t) {
  switch (t) {
    case gguf_type::u8:
    case gguf_type::i8:
    case gguf_type::boolean:
      return 1;
    case gguf_type::u16:
    case gguf_type::i16:
      return 2;
    case gguf_type::u32:
    case gguf_type::i32:
    case gguf_type::f32:
      return 4;
    case gguf_type::u64:
    case gguf_type::i64:
    case gguf_type::f64:
      return 8;
    case gguf_type::string:
    case gguf_type::array:
      return 0;
  }
  return 0;
}

bool gguf_value::is_integer() const {
  switch (type) {
    case gguf_type::u8:
    case gguf_type::u16:
    case gguf_type::u32:
    case gguf_type::u64:
    case gguf_type::i8:
    case gguf_type::i16:
    case gguf_type::i32:
    case gguf_type::i64:
      return true;
    default:
      return false;
  }
}

namespace {
template <typename T>
T load_at(std::span<const std::byte> raw, uint64_t k) {
  T v;
  std::memcpy(&v, raw.data() + k * sizeof(T), sizeof(T));
  return v;
}

// Casting a double outside the int64 range (or NaN) to int64 is undefined; clamp instead.
int64_t saturate_to_int64(double v) {
  constexpr double two_63 = 9223372036854775808.0;  // 2^63, exact in a double
  if (std::isnan(v)) return 0;
  if (v >= two_63) return std::numeric_limits<int64_t>::max();
  if (v < -two_63) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(v);
}
}  // namespace

double gguf_value::array_number(uint64_t k) const {
  switch (elem_type) {
    case gguf_type::f32:
      return load_at<float>(raw, k);
    case gguf_type::f64:
      return load_at<double>(raw, k);
    case gguf_type::u64:
      return static_cast<double>(load_at<uint64_t>(raw, k));
    default:
      return static_cast<double>(array_integer(k));
  }
}

int64_t gguf_value::array_integer(uint64_t k) const {
  switch (elem_type) {
    case gguf_type::u8:
      return load_at<uint8_t>(raw, k);
    case gguf_type::i8:
      return load_at<int8_t>(raw, k);
    case gguf_type::boolean:
      return load_at<uint8_t>(raw, k);
    case gguf_type::u16:
      return load_at<uint16_t>(raw, k);
    case gguf_type::i16:
      return load_at<int16_t>(raw, k);
    case gguf_type::u32:
      return load_at<uint32_t>(raw, k);
    case gguf_type::i32:
      return load_at<int32_t>(raw, k);
    case gguf_type::u64: {
      const auto u = load_at<uint64_t>(raw, k);
      return u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ? std::numeric_limits<int64_t>::max() : static_cast<int64_t>(u);
    }
    case gguf_type::i64:
      return load_at<int64_t>(raw, k);
    case gguf_type::f32:
      return saturate_to_int64(load_at<float>(raw, k));
    case gguf_type::f64:
      return saturate_to_int64(load_at<double>(raw, k));
    default:
      return 0;
  }
}

int64_t gguf_tensor::elements() const {
  int64_t n = 1;
  for (auto d : ne) n *= d;  // overflow was excluded when the file was parsed
  return n;
}

gguf_file::gguf_file(const std::string& path, const gguf_limits& limits) : map_(path) {
  cursor c(map_.bytes(), map_.path());
  const auto magic = c.read<uint32_t>("magic");
  if (magic != k_magic) c.fail("not a GGUF file (bad magic)", 0);
  version_ = c.read<uint32_t>("version");
  if (version_ == 1) c.fail("GGUF version 1 is not supported (only 2 and 3)", 4);
  if (version_ != 2 && version_ != 3) c.fail("unsupported GGUF version " + std::to_string(version_) + " (only 2 and 3)", 4);
  const auto n_tensors = c.read<uint64_t>("tensor count");
  const auto n_kv = c.read<uint64_t>("metadata count");
  // A key-value pair takes at least 8 (key length) + 4 (type) + 1 bytes; a tensor info at
  // least 8 + 4 + 4 + 8 bytes. Counts beyond what the file can hold are refused up front.
  if (n_kv > c.remaining() / 13) c.fail("metadata count " + std::to_string(n_kv) + " cannot fit in the file", 16);
  if (n_tensors > c.remaining() / 24) c.fail("tensor count " + std::to_string(n_tensors) + " cannot fit in the file", 8);
  if (n_kv > limits.metadata_keys)
    c.fail("metadata count " + std::to_string(n_kv) + " exceeds the limit of " + std::to_string(limits.metadata_keys), 16);

  // Reserved in full so that the names the indexes view never move (see the header).
  kvs_.reserve(n_kv);
  kv_index_.reserve(n_kv);
  value_reader values(c, limits);
  for (uint64_t k = 0; k < n_kv; ++k) {
    const uint64_t at = c.pos();
    auto key_name = [k] { return "metadata key #" + std::to_string(k); };
    auto& kv = kvs_.emplace_back();
    kv.offset = at;
    kv.key = c.read_string(key_name, k_max_name);
    if (kv.key.empty()) c.fail(key_name() + " is empty", at);
    if (!kv_index_.try_emplace(kv.key, kvs_.size() - 1).second) c.fail("duplicate metadata key '" + kv.key + "'", at);
    const uint64_t type_at = c.pos();
    const auto t = c.read<uint32_t>([&] { return "key '" + kv.key + "' (value type)"; });
    if (!valid_type(t)) c.fail("key '" + kv.key + "': unknown value type " + std::to_string(t), type_at);
    values.read(kv.key, static_cast<gguf_type>(t), kv.value);
  }

  if (const auto* a = find("general.alignment")) {
    if (a->type != gguf_type::u32 || a->u == 0 || a->u % 8 != 0 || a->u > (1u << 20))
      fail_key("general.alignment", "must be a u32 multiple of 8 (at most 1 MiB)");
    alignment_ = a->u;
  }

  tensors_.reserve(n_tensors);
  tensor_index_.reserve(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    const uint64_t at = c.pos();
    auto& t = tensors_.emplace_back();
    t.name = c.read_string([k] { return "tensor info #" + std::to_string(k) + " (name)"; }, k_max_name);
    auto what = [&t] { return "tensor '" + t.name + "'"; };
    if (!tensor_index_.try_emplace(t.name, tensors_.size() - 1).second) c.fail("duplicate " + what(), at);
    const uint64_t dims_at = c.pos();
    const auto n_dims = c.read<uint32_t>([&] { return what() + " (dimension count)"; });
    if (n_dims == 0 || n_dims > k_max_dims)
      c.fail(what() + ": " + std::to_string(n_dims) + " dimensions (must be 1.." + std::to_string(k_max_dims) + ")", dims_at);
    t.ne.reserve(n_dims);
    uint64_t elems = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t dim_at = c.pos();
      const auto ne = c.read<uint64_t>([&] { return what() + " (dimension)"; });
      if (ne == 0 || ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        c.fail(what() + ": dimension " + std::to_string(d) + " is " + std::to_string(ne), dim_at);
      if (elems > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / ne)
        c.fail(what() + ": element count overflows (dimensions multiply past 2^63)", dim_at);
      elems *= ne;
      t.ne.push_back(static_cast<int64_t>(ne));
    }
    const uint64_t type_at = c.pos();
    const auto type_id = c.read<uint32_t>([&] { return what() + " (type)"; });
    const auto ti = kernels::find_weight_type(type_id);
    if (!ti) c.fail(what() + ": unknown tensor type " + std::to_string(type_id), type_at);
    t.type = ti->type;
    if (t.ne[0] % ti->block_elems != 0)
      c.fail(what() + ": first dimension " + std::to_string(t.ne[0]) + " is not a multiple of the " + kernels::display_name(t.type) + " block size " +
                 std::to_string(ti->block_elems),
             dims_at);
    // elems < 2^63 and block_bytes <= 292, so this product is bounded by checking in two steps.
    const uint64_t blocks = elems / ti->block_elems;
    if (blocks > std::numeric_limits<uint64_t>::max() / ti->block_bytes) c.fail(what() + ": byte size overflows", dims_at);
    t.bytes = blocks * ti->block_bytes;
    const uint64_t off_at = c.pos();
    t.offset = c.read<uint64_t>([&] { return what() + " (offset)"; });
    if (t.offset % alignment_ != 0)
      c.fail(what() + ": data offset " + std::to_string(t.offset) + " is not a multiple of the alignment " + std::to_string(alignment_), off_at);
  }

  const uint64_t header_end = c.pos();
  data_offset_ = header_end + (alignment_ - header_end % alignment_) % alignment_;
  const uint64_t size = map_.size();
  // A file cut before its data section leaves data_size 0, so the loop below names the first
  // tensor that has no data.
  const uint64_t data_size = data_offset_ <= size ? size - data_offset_ : 0;

  // Every tensor must lie inside the data section and no two may overlap.
  std::vector<const gguf_tensor*> by_offset;
  for (auto& t : tensors_) {
    if (t.offset > data_size || t.bytes > data_size - t.offset) {
      // The absolute position of the claimed data; a wild offset would wrap, so name the end.
      const uint64_t at = t.offset > std::numeric_limits<uint64_t>::max() - data_offset_ ? size : data_offset_ + t.offset;
      throw gguf_error(map_.path() + ": offset " + std::to_string(at) + ": tensor '" + t.name + "': data (" + std::to_string(t.bytes) +
                       " bytes at data offset " + std::to_string(t.offset) + ") extends past the end of the file (data section is " +
                       std::to_string(data_size) + " bytes)");
    }
    t.data = map_.bytes().subspan(data_offset_ + t.offset, t.bytes);
    by_offset.push_back(&t);
  }
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t k = 1; k < by_offset.size(); ++k) {
    const auto* prev = by_offset[k - 1];
    const auto* cur = by_offset[k];
    if (prev->offset + prev->bytes > cur->offset)
      throw gguf_error(map_.path() + ": offset " + std::to_string(data_offset_ + cur->offset) + ": tensor '" + cur->name + "' overlaps tensor '" +
                       prev->name + "'");
  }
}

const gguf_value* gguf_file::find(std::string_view key) const {
  const auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kvs_[it->second].value;
}

const gguf_tensor* gguf_file::find_tensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const gguf_tensor& gguf_file::tensor(std::string_view name) const {
  if (const auto* t = find_tensor(name)) return *t;
  throw gguf_error(path() + ": tensor '" + std::string(name) + "' is missing");
}

void gguf_file::fail_key(std::string_view key, const std::string& what) const {
  std::string where;
  if (const auto it = kv_index_.find(key); it != kv_index_.end()) where = "offset " + std::to_string(kvs_[it->second].offset) + ": ";
  throw gguf_error(path() + ": " + where + "key '" + std::string(key) + "': " + what);
}

std::optional<std::string> gguf_file::get_string(std::string_view key) const {
  const auto* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != gguf_type::string) fail_key(key, "expected a string, found " + std::string(gguf_type_name(v->type)));
  return v->str;
}

std::optional<int64_t> gguf_file::get_int(std::string_view key) const {
  const auto* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_integer()) fail_key(key, "expected an integer, found " + std::string(gguf_type_name(v->type)));
  if (v->type == gguf_type::u8 || v->type == gguf_type::u16 || v->type == gguf_type::u32 || v->type == gguf_type::u64) {
    if (v->u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) fail_key(key, "value out of range");
    return static_cast<int64_t>(v->u);
  }
  return v->i;
}

std::optional<double> gguf_file::get_float(std::string_view key) const {
  const auto* v = find(key);
  if (!v) return std::nullopt;
  if (v->is_float()) return v->f;
  if (v->is_integer()) return static_cast<double>(*get_int(key));
  fail_key(key, "expected a number, found " + std::string(gguf_type_name(v->type)));
}

std::optional<bool> gguf_file::get_bool(std::string_view key) const {
  const auto* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != gguf_type::boolean) fail_key(key, "expected a bool, found " + std::string(gguf_type_name(v->type)));
  return v->b;
}

std::optional<std::vector<std::string>> gguf_file::get_strings(std::string_view key) const {
  const auto* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != gguf_type::array || v->elem_type != gguf_type::string) fail_key(key, "expected an array of strings");
  return v->strings;
}

std::optional<std::vector<float>> gguf_file::get_floats(std::string_view key) const {
  const auto* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != gguf_type::array || gguf_scalar_size(v->elem_type) == 0 || v->elem_type == gguf_type::boolean)
    fail_key(key, "expected an array of numbers");
  std::vector<float> out(v->count);
  for (uint64_t k = 0; k < v->count; ++k) {
    const double x = v->array_number(k);
    // A double beyond the float range does not convert (undefined behaviour); infinities
    // and NaN do.
    if (std::isfinite(x) && std::fabs(x) > FLT_MAX)
      fail_key(key, "element " + std::to_string(k) + " (" + std::to_string(x) + ") is out of the float range");
    out[k] = static_cast<float>(x);
  }
  return out;
}

std::optional<std::vector<int64_t>> gguf_file::get_ints(std::string_view key) const {
  const auto* v = find(key);
  if (!v) return std::nullopt;
  if (v->type != gguf_type::array || gguf_scalar_size(v->elem_type) == 0 || v->elem_type == gguf_type::f32 || v->elem_type == gguf_type::f64)
    fail_key(key, "expected an array of integers");
  std::vector<int64_t> out(v->count);
  for (uint64_t k = 0; k < v->count; ++k) {
    if (v->elem_type == gguf_type::u64 && load_at<uint64_t>(v->raw, k) > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail_key(key, "element " + std::to_string(k) + " (" + std::to_string(load_at<uint64_t>(v->raw, k)) + ") is out of range");
    out[k] = v->array_integer(k);
  }
  return out;
}

}  // namespace tandem::models
