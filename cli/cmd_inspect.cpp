// `tandem inspect FILE`: a readable dump of a GGUF file: header, one line per metadata key,
// the tensor table and totals. A malformed file is reported by the reader's gguf_error (file,
// offset, key or tensor) and exits with status 1.
#include <algorithm>
#include <charconv>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>

#include "cli/command_registry.h"
#include "models/gguf_reader.h"

namespace tandem::cli {
namespace {

using models::gguf_type;
using models::gguf_value;

constexpr size_t k_max_string = 64;  // longer strings (chat templates) are cut here
constexpr size_t k_max_element_string = 24;
constexpr uint64_t k_string_elements = 3;  // array elements shown
constexpr uint64_t k_number_elements = 6;

// Quoted, with control characters escaped so every key stays on one line; cut at `limit`
// bytes (never inside a UTF-8 sequence) with the full length appended.
std::string quote(const std::string& s, size_t limit) {
  size_t cut = s.size();
  if (s.size() > limit) {
    cut = limit;
    while (cut > 0 && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  }
  std::string out = "\"";
  for (size_t k = 0; k < cut; ++k) {
    const auto c = static_cast<unsigned char>(s[k]);
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\r':
        out += "\\r";
        break;
      default:
        if (c < 0x20 || c == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\x%02x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
  if (cut < s.size()) out += "... (" + std::to_string(s.size()) + " bytes)";
  return out;
}

template <typename T>
std::string shortest(T v) {  // shortest text that reads back as the same float
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

std::string array_header(const gguf_value& v) {
  return "[" + std::string(models::gguf_type_name(v.elem_type)) + " x " + std::to_string(v.count) + "]";
}

std::string array_element(const gguf_value& v, uint64_t k) {
  switch (v.elem_type) {
    case gguf_type::string:
      return quote(v.strings[k], k_max_element_string);
    case gguf_type::array:
      return array_header(v.arrays[k]);
    case gguf_type::boolean:
      return v.array_integer(k) ? "true" : "false";
    case gguf_type::f32:
      return shortest(static_cast<float>(v.array_number(k)));
    case gguf_type::f64:
      return shortest(v.array_number(k));
    case gguf_type::u64: {
      uint64_t x;
      std::memcpy(&x, v.raw.data() + 8 * k, 8);
      return std::to_string(x);
    }
    default:
      return std::to_string(v.array_integer(k));
  }
}

// "TYPE  VALUE" for a scalar, "[TYPE x N] e0, e1, e2, ..." for an array.
std::string describe(const gguf_value& v) {
  auto typed = [&](const std::string& text) {
    std::string t(models::gguf_type_name(v.type));
    t.resize(std::max<size_t>(t.size(), 7), ' ');
    return t + " " + text;
  };
  switch (v.type) {
    case gguf_type::u8:
    case gguf_type::u16:
    case gguf_type::u32:
    case gguf_type::u64:
      return typed(std::to_string(v.u));
    case gguf_type::i8:
    case gguf_type::i16:
    case gguf_type::i32:
    case gguf_type::i64:
      return typed(std::to_string(v.i));
    case gguf_type::f32:
      return typed(shortest(static_cast<float>(v.f)));
    case gguf_type::f64:
      return typed(shortest(v.f));
    case gguf_type::boolean:
      return typed(v.b ? "true" : "false");
    case gguf_type::string:
      return typed(quote(v.str, k_max_string));
    case gguf_type::array:
      break;
  }
  std::string out = array_header(v);
  const uint64_t shown =
      std::min(v.count, v.elem_type == gguf_type::string || v.elem_type == gguf_type::array ? k_string_elements : k_number_elements);
  for (uint64_t k = 0; k < shown; ++k) out += (k == 0 ? " " : ", ") + array_element(v, k);
  if (shown < v.count) out += ", ...";
  return out;
}

std::string pad(std::string s, size_t width) {
  if (s.size() < width) s.resize(width, ' ');
  return s;
}

std::string pad_left(const std::string& s, size_t width) { return s.size() < width ? std::string(width - s.size(), ' ') + s : s; }

std::string dims(const std::vector<int64_t>& ne) {
  std::string s;
  for (size_t d = 0; d < ne.size(); ++d) s += (d ? " x " : "") + std::to_string(ne[d]);
  return s;
}

std::string mib(uint64_t bytes) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f MiB", static_cast<double>(bytes) / (1 << 20));
  return buf;
}

void inspect(const std::string& path) {
  const models::gguf_file f(path);
  std::string out;
  out += "file: " + path + "\n";
  out += "GGUF version " + std::to_string(f.version()) + ", " + std::to_string(f.file_size()) + " bytes, alignment " + std::to_string(f.alignment()) +
         ", data section at offset " + std::to_string(f.data_offset()) + "\n";

  out += "\nmetadata: " + std::to_string(f.metadata().size()) + " keys\n";
  size_t key_width = 0;
  for (const auto& kv : f.metadata()) key_width = std::max(key_width, std::min<size_t>(kv.key.size(), 48));
  for (const auto& kv : f.metadata()) out += "  " + pad(kv.key, key_width) + "  " + describe(kv.value) + "\n";

  out += "\ntensors: " + std::to_string(f.tensors().size()) + "\n";
  size_t name_width = 4;
  for (const auto& t : f.tensors()) name_width = std::max(name_width, t.name.size());
  if (!f.tensors().empty())
    out += "  " + pad("name", name_width) + "  " + pad("type", 7) + "  " + pad("dims", 22) + "  " + pad_left("bytes", 12) + "  " +
           pad_left("file offset", 12) + "\n";
  struct type_total {
    int64_t tensors = 0;
    int64_t params = 0;
    uint64_t bytes = 0;
  };
  std::map<std::string, type_total> by_type;
  int64_t params = 0;
  uint64_t bytes = 0;
  for (const auto& t : f.tensors()) {
    const auto type = kernels::display_name(t.type);
    out += "  " + pad(t.name, name_width) + "  " + pad(type, 7) + "  " + pad(dims(t.ne), 22) + "  " + pad_left(std::to_string(t.bytes), 12) + "  " +
           pad_left(std::to_string(f.data_offset() + t.offset), 12) + "\n";
    auto& tt = by_type[type];
    ++tt.tensors;
    tt.params += t.elements();
    tt.bytes += t.bytes;
    params += t.elements();
    bytes += t.bytes;
  }

  out += "\ntotals: " + std::to_string(f.tensors().size()) + " tensors, " + std::to_string(params) + " parameters, " + std::to_string(bytes) +
         " bytes (" + mib(bytes) + ")\n";
  for (const auto& [type, tt] : by_type)
    out += "  " + pad(type, 7) + "  " + pad_left(std::to_string(tt.tensors), 5) + " tensors  " + pad_left(std::to_string(tt.params), 12) +
           " parameters  " + pad_left(std::to_string(tt.bytes), 12) + " bytes (" + mib(tt.bytes) + ")\n";
  std::fwrite(out.data(), 1, out.size(), stdout);
  std::fflush(stdout);
}

void add_inspect_command(CLI::App& root) {
  auto path = std::make_shared<std::string>();
  auto* cmd = root.add_subcommand("inspect", "Print a GGUF file's header, metadata, tensor table and totals");
  cmd->add_option("file", *path, "GGUF file")->required();
  cmd->callback([path] { inspect(*path); });
}

const command_registrar reg{"inspect", &add_inspect_command};

}  // namespace
}  // namespace tandem::cli
