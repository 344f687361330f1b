#include "api/model_details.h"

#include <chrono>
#include <cstdio>
#include <map>

#include "kernels/weight_type.h"
#include "models/fim.h"

namespace tandem::api {

namespace {

std::string short_count(uint64_t n) {
  char buf[32];
  if (n >= 1'000'000'000)
    std::snprintf(buf, sizeof buf, "%.1fB", static_cast<double>(n) / 1e9);
  else if (n >= 1'000'000)
    std::snprintf(buf, sizeof buf, "%.0fM", static_cast<double>(n) / 1e6);
  else
    std::snprintf(buf, sizeof buf, "%.0fK", static_cast<double>(n) / 1e3);
  return buf;
}

// FNV-1a, four lanes with different seeds: an identity, not a security property.
std::string identity_hex(const std::string& text) {
  std::string out;
  for (uint64_t lane = 0; lane < 4; ++lane) {
    uint64_t h = 14695981039346656037ull ^ (lane * 0x9E3779B97F4A7C15ull);
    for (const unsigned char c : text) {
      h ^= c;
      h *= 1099511628211ull;
    }
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
    out += buf;
  }
  return out;
}

}  // namespace

model_details details_of(const runtime::served_model& m) {
  model_details d;
  d.family = std::string(models::architecture_name(m.model->config().arch));
  std::map<kernels::weight_type, uint64_t> bytes;
  for (const auto& t : m.model->file().tensors()) {
    d.parameters += static_cast<uint64_t>(t.elements());
    if (t.ne.size() >= 2) bytes[t.type] += t.bytes;
  }
  d.parameter_size = short_count(d.parameters);
  kernels::weight_type top{};
  uint64_t most = 0;
  for (const auto& [t, b] : bytes)
    if (b > most) {
      most = b;
      top = t;
    }
  d.quantization = most > 0 ? kernels::display_name(top) : "F32";
  const auto mtime = std::chrono::duration_cast<std::chrono::seconds>(m.created.time_since_epoch()).count();
  d.digest = identity_hex(m.entry->file + "\n" + std::to_string(m.file_bytes) + "\n" + std::to_string(mtime));
  d.fim = models::find_fim_tokens(*m.tokenizer).usable();
  return d;
}

}  // namespace tandem::api
