#include "models/gguf_writer.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <memory>
#include <stdexcept>

namespace tandem::models {
namespace {

constexpr uint32_t k_magic = 0x46554747;  // "GGUF" read little-endian
constexpr uint64_t k_max_name = 65535;    // the reader's limit for keys and tensor names

template <typename T>
void append(std::vector<std::byte>& out, T v) {
  const auto at = out.size();
  out.resize(at + sizeof(T));
  std::memcpy(out.data() + at, &v, sizeof(T));
}

void append_string(std::vector<std::byte>& out, std::string_view s) {
  append<uint64_t>(out, s.size());
  // resize + memcpy rather than insert: g++ 12 warns (falsely) on the inlined insert.
  const auto at = out.size();
  out.resize(at + s.size());
  if (!s.empty()) std::memcpy(out.data() + at, s.data(), s.size());
}

uint64_t align_up(uint64_t x, uint64_t a) { return x + (a - x % a) % a; }

// Payload of an array value as read from a file: element type, count, elements.
void append_array_payload(std::vector<std::byte>& out, const gguf_value& v) {
  append<uint32_t>(out, static_cast<uint32_t>(v.elem_type));
  append<uint64_t>(out, v.count);
  if (v.elem_type == gguf_type::string) {
    for (const auto& s : v.strings) append_string(out, s);
  } else if (v.elem_type == gguf_type::array) {
    for (const auto& a : v.arrays) append_array_payload(out, a);
  } else {
    out.insert(out.end(), v.raw.begin(), v.raw.end());
  }
}

}  // namespace

gguf_out_value gguf_out_value::string(std::string_view s) {
  gguf_out_value out;
  out.type_ = gguf_type::string;
  append_string(out.payload_, s);
  return out;
}

gguf_out_value gguf_out_value::raw_array(gguf_type elem, uint64_t count, std::span<const std::byte> elems) {
  gguf_out_value out;
  out.type_ = gguf_type::array;
  out.payload_.reserve(12 + elems.size());
  append<uint32_t>(out.payload_, static_cast<uint32_t>(elem));
  append<uint64_t>(out.payload_, count);
  out.payload_.insert(out.payload_.end(), elems.begin(), elems.end());
  return out;
}

gguf_out_value gguf_out_value::bools(const std::vector<bool>& v) {
  std::vector<std::byte> bytes;
  bytes.reserve(v.size());
  for (bool b : v) bytes.push_back(std::byte{b ? uint8_t{1} : uint8_t{0}});
  return raw_array(gguf_type::boolean, v.size(), bytes);
}

gguf_out_value gguf_out_value::strings(const std::vector<std::string>& v) {
  gguf_out_value out;
  out.type_ = gguf_type::array;
  append<uint32_t>(out.payload_, static_cast<uint32_t>(gguf_type::string));
  append<uint64_t>(out.payload_, v.size());
  for (const auto& s : v) append_string(out.payload_, s);
  return out;
}

gguf_out_value gguf_out_value::arrays(const std::vector<gguf_out_value>& v) {
  gguf_out_value out;
  out.type_ = gguf_type::array;
  append<uint32_t>(out.payload_, static_cast<uint32_t>(gguf_type::array));
  append<uint64_t>(out.payload_, v.size());
  // A nested element is written without its own type id: just its array payload.
  for (const auto& e : v) {
    if (e.type_ != gguf_type::array)
      throw std::invalid_argument("gguf_out_value::arrays: element of type " + std::string(gguf_type_name(e.type_)) + " in an array of arrays");
    out.payload_.insert(out.payload_.end(), e.payload_.begin(), e.payload_.end());
  }
  return out;
}

gguf_out_value gguf_out_value::from(const gguf_value& v) {
  gguf_out_value out;
  out.type_ = v.type;
  switch (v.type) {
    case gguf_type::u8:
      append<uint8_t>(out.payload_, static_cast<uint8_t>(v.u));
      break;
    case gguf_type::u16:
      append<uint16_t>(out.payload_, static_cast<uint16_t>(v.u));
      break;
    case gguf_type::u32:
      append<uint32_t>(out.payload_, static_cast<uint32_t>(v.u));
      break;
    case gguf_type::u64:
      append<uint64_t>(out.payload_, v.u);
      break;
    case gguf_type::i8:
      append<int8_t>(out.payload_, static_cast<int8_t>(v.i));
      break;
    case gguf_type::i16:
      append<int16_t>(out.payload_, static_cast<int16_t>(v.i));
      break;
    case gguf_type::i32:
      append<int32_t>(out.payload_, static_cast<int32_t>(v.i));
      break;
    case gguf_type::i64:
      append<int64_t>(out.payload_, v.i);
      break;
    case gguf_type::f32:
      append<float>(out.payload_, static_cast<float>(v.f));
      break;
    case gguf_type::f64:
      append<double>(out.payload_, v.f);
      break;
    case gguf_type::boolean:
      append<uint8_t>(out.payload_, v.b ? 1 : 0);
      break;
    case gguf_type::string:
      append_string(out.payload_, v.str);
      break;
    case gguf_type::array:
      append_array_payload(out.payload_, v);
      break;
  }
  return out;
}

const gguf_layout::kv_at& gguf_layout::kv(std::string_view key) const {
  for (const auto& k : kvs)
    if (k.key == key) return k;
  throw std::out_of_range("gguf_layout: no key '" + std::string(key) + "'");
}

const gguf_layout::tensor_at& gguf_layout::tensor(std::string_view name) const {
  for (const auto& t : tensors)
    if (t.name == name) return t;
  throw std::out_of_range("gguf_layout: no tensor '" + std::string(name) + "'");
}

gguf_writer::gguf_writer(uint32_t version) : version_(version) {
  if (version != 2 && version != 3) throw std::invalid_argument("gguf_writer: version " + std::to_string(version) + " (only 2 and 3 can be written)");
}

void gguf_writer::set(std::string key, gguf_out_value value) {
  if (key.empty() || key.size() > k_max_name)
    throw std::invalid_argument("gguf_writer: key '" + key.substr(0, 64) + "' must be 1.." + std::to_string(k_max_name) + " bytes");
  // The alignment also decides the layout, so it has one entry point that validates it.
  if (key == "general.alignment") throw std::invalid_argument("gguf_writer: set general.alignment with set_alignment()");
  for (auto& kv : kvs_)
    if (kv.key == key) {
      kv.value = std::move(value);
      return;
    }
  kvs_.push_back({std::move(key), std::move(value)});
}

void gguf_writer::set_alignment(uint32_t alignment) {
  if (alignment == 0 || alignment % 8 != 0 || alignment > (1u << 20))
    throw std::invalid_argument("gguf_writer: general.alignment " + std::to_string(alignment) + " must be a multiple of 8 (at most 1 MiB)");
  alignment_ = alignment;
  for (auto& kv : kvs_)
    if (kv.key == "general.alignment") {
      kv.value = gguf_out_value::u32(alignment);
      return;
    }
  kvs_.push_back({"general.alignment", gguf_out_value::u32(alignment)});
}

bool gguf_writer::has(std::string_view key) const {
  for (const auto& kv : kvs_)
    if (kv.key == key) return true;
  return false;
}

void gguf_writer::add_tensor(std::string name, std::vector<int64_t> ne, kernels::weight_type type, tensor_fill fill) {
  const std::string what = "gguf_writer: tensor '" + name + "'";
  if (name.empty() || name.size() > k_max_name) throw std::invalid_argument(what + ": name must be 1.." + std::to_string(k_max_name) + " bytes");
  for (const auto& t : tensors_)
    if (t.name == name) throw std::invalid_argument(what + " added twice");
  if (ne.empty() || ne.size() > 4) throw std::invalid_argument(what + ": " + std::to_string(ne.size()) + " dimensions (must be 1..4)");
  uint64_t elems = 1;
  for (auto d : ne) {
    if (d <= 0) throw std::invalid_argument(what + ": dimension " + std::to_string(d) + " must be positive");
    if (elems > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / static_cast<uint64_t>(d))
      throw std::invalid_argument(what + ": element count overflows");
    elems *= static_cast<uint64_t>(d);
  }
  const auto& ti = kernels::info(type);
  if (ne[0] % ti.block_elems != 0)
    throw std::invalid_argument(what + ": first dimension " + std::to_string(ne[0]) + " is not a multiple of the " + kernels::display_name(type) +
                                " block size " + std::to_string(ti.block_elems));
  if (!fill) throw std::invalid_argument(what + ": no data source");
  const uint64_t bytes = elems / ti.block_elems * ti.block_bytes;
  tensors_.push_back({std::move(name), std::move(ne), type, bytes, std::move(fill)});
}

void gguf_writer::add_tensor(std::string name, std::vector<int64_t> ne, kernels::weight_type type, std::vector<std::byte> data) {
  auto shared = std::make_shared<const std::vector<std::byte>>(std::move(data));
  const std::string label = name;
  add_tensor(std::move(name), std::move(ne), type, [shared](std::span<std::byte> out) { std::memcpy(out.data(), shared->data(), out.size()); });
  if (tensors_.back().bytes != shared->size()) {
    const auto expected = tensors_.back().bytes;
    tensors_.pop_back();
    throw std::invalid_argument("gguf_writer: tensor '" + label + "': " + std::to_string(shared->size()) +
                                " bytes of data given, its shape and type need " + std::to_string(expected));
  }
}

gguf_layout gguf_writer::layout() const {
  gguf_layout l;
  uint64_t pos = 24;  // magic, version, tensor count, metadata count
  for (const auto& kv : kvs_) {
    gguf_layout::kv_at k;
    k.key = kv.key;
    k.key_offset = pos;
    k.type_offset = pos + 8 + kv.key.size();
    k.value_offset = k.type_offset + 4;
    k.end = k.value_offset + kv.value.payload().size();
    pos = k.end;
    l.kvs.push_back(std::move(k));
  }
  uint64_t data_pos = 0;
  for (const auto& t : tensors_) {
    gguf_layout::tensor_at a;
    a.name = t.name;
    a.info_offset = pos;
    a.n_dims_offset = pos + 8 + t.name.size();
    a.ne_offset = a.n_dims_offset + 4;
    a.type_offset = a.ne_offset + 8 * t.ne.size();
    a.offset_offset = a.type_offset + 4;
    pos = a.offset_offset + 8;
    a.data_offset = data_pos;  // relative for now; made absolute below
    a.bytes = t.bytes;
    data_pos += align_up(t.bytes, alignment_);
    l.tensors.push_back(std::move(a));
  }
  l.header_end = pos;
  l.data_offset = align_up(pos, alignment_);
  for (auto& a : l.tensors) a.data_offset += l.data_offset;
  l.file_size = l.data_offset + data_pos;
  return l;
}

void gguf_writer::emit(const std::function<void(std::span<const std::byte>)>& sink) const {
  std::vector<std::byte> head;
  append<uint32_t>(head, k_magic);
  append<uint32_t>(head, version_);
  append<uint64_t>(head, tensors_.size());
  append<uint64_t>(head, kvs_.size());
  for (const auto& kv : kvs_) {
    append_string(head, kv.key);
    append<uint32_t>(head, static_cast<uint32_t>(kv.value.type()));
    head.insert(head.end(), kv.value.payload().begin(), kv.value.payload().end());
  }
  uint64_t data_pos = 0;
  uint64_t largest = 0;
  for (const auto& t : tensors_) {
    append_string(head, t.name);
    append<uint32_t>(head, static_cast<uint32_t>(t.ne.size()));
    for (auto d : t.ne) append<uint64_t>(head, static_cast<uint64_t>(d));
    append<uint32_t>(head, static_cast<uint32_t>(t.type));
    append<uint64_t>(head, data_pos);
    data_pos += align_up(t.bytes, alignment_);
    largest = std::max(largest, t.bytes);
  }
  head.resize(align_up(head.size(), alignment_), std::byte{0});
  sink(head);
  head = {};

  // One buffer, reused: the peak is the largest tensor, not the model.
  std::vector<std::byte> buf(largest);
  const std::vector<std::byte> zeros(alignment_);
  for (const auto& t : tensors_) {
    std::span<std::byte> out(buf.data(), t.bytes);
    std::fill(out.begin(), out.end(), std::byte{0});
    t.fill(out);
    sink(out);
    const uint64_t pad = align_up(t.bytes, alignment_) - t.bytes;
    sink(std::span<const std::byte>(zeros.data(), pad));
  }
}

std::vector<std::byte> gguf_writer::to_bytes() const {
  std::vector<std::byte> out;
  out.reserve(layout().file_size);
  emit([&](std::span<const std::byte> b) { out.insert(out.end(), b.begin(), b.end()); });
  return out;
}

void gguf_writer::write(const std::string& path) const {
  const std::string tmp = path + ".tmp";
  std::FILE* f = std::fopen(tmp.c_str(), "wb");
  if (!f) throw std::runtime_error(path + ": cannot open " + tmp + " for writing");
  try {
    emit([&](std::span<const std::byte> b) {
      if (!b.empty() && std::fwrite(b.data(), 1, b.size(), f) != b.size()) throw std::runtime_error(path + ": write failed (disk full?)");
    });
    if (std::fclose(f) != 0) {
      f = nullptr;
      throw std::runtime_error(path + ": write failed when closing the file");
    }
    f = nullptr;
    if (std::rename(tmp.c_str(), path.c_str()) != 0) throw std::runtime_error(path + ": cannot rename " + tmp + " into place");
  } catch (...) {
    if (f) std::fclose(f);
    std::remove(tmp.c_str());
    throw;
  }
}

}  // namespace tandem::models
