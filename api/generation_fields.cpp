#include "api/generation_fields.h"

#include <cstdint>
#include <limits>
#include <random>

#include "api/api_error.h"
#include "api/json_fields.h"

namespace tandem::api {
namespace {

using json = nlohmann::json;

constexpr double k_inf = std::numeric_limits<double>::infinity();

}  // namespace

uint64_t random_seed() {
  std::random_device rd;
  return (static_cast<uint64_t>(rd()) << 32) ^ rd();
}

void read_seed(const json& obj, std::string_view parent, runtime::sampling_params& p) {
  const auto seed = optional_seed(obj, "seed", parent);
  p.seed = seed ? *seed : random_seed();
}

void read_penalties(const json& obj, std::string_view parent, runtime::sampling_params& p) {
  if (auto v = optional_number(obj, "presence_penalty", -2, 2, parent)) p.presence_penalty = static_cast<float>(*v);
  if (auto v = optional_number(obj, "frequency_penalty", -2, 2, parent)) p.frequency_penalty = static_cast<float>(*v);
}

std::optional<float> optional_repeat_penalty(const json& obj, std::string_view key, std::string_view parent) {
  const auto v = optional_number(obj, key, -k_inf, k_inf, parent);
  if (!v) return std::nullopt;
  // Zero divides positive logits by zero in the sampler; a value that rounds to 0 as a float
  // or overflows it would do the same.
  const auto f = static_cast<float>(*v);
  if (!(f > 0.0f && f < std::numeric_limits<float>::infinity())) {
    const std::string path = field_path(parent, key);
    throw bad_request("'" + path + "' must be greater than 0 (1 disables it)", path);
  }
  return f;
}

void read_llama_sampling(const json& obj, std::string_view parent, runtime::sampling_params& p) {
  if (auto v = optional_number(obj, "temperature", 0, k_inf, parent)) p.temperature = static_cast<float>(*v);
  constexpr int64_t int_min = std::numeric_limits<int32_t>::min(), int_max = std::numeric_limits<int32_t>::max();
  if (auto v = optional_integer(obj, "top_k", int_min, int_max, parent)) p.top_k = static_cast<int>(*v);
  if (auto v = optional_number(obj, "top_p", 0, 1, parent)) p.top_p = static_cast<float>(*v);
  if (auto v = optional_number(obj, "min_p", 0, 1, parent)) p.min_p = static_cast<float>(*v);
  if (auto v = optional_repeat_penalty(obj, "repeat_penalty", parent)) p.repeat_penalty = *v;
  if (auto v = optional_integer(obj, "repeat_last_n", -1, int_max, parent)) p.repeat_last_n = static_cast<int>(*v);
  read_penalties(obj, parent, p);
  read_seed(obj, parent, p);
}

std::string as_stop_string(const json& v, const std::string& path) {
  std::string s = as_string(v, path);
  if (s.empty()) throw bad_request("'" + path + "' must not be empty", path);
  return s;
}

std::vector<std::string> read_stop_array(const json& obj, std::string_view key, std::string_view parent, size_t max_count) {
  const json* v = optional_array(obj, key, parent);
  if (!v) return {};
  const std::string path = field_path(parent, key);
  if (v->size() > max_count)
    throw bad_request("'" + path + "' may hold at most " + std::to_string(max_count) + " stop strings, got " + std::to_string(v->size()), path);
  std::vector<std::string> out;
  out.reserve(v->size());
  for (size_t i = 0; i < v->size(); ++i) out.push_back(as_stop_string((*v)[i], index_path(path, i)));
  return out;
}

void check_token_cap(int64_t n, const std::string& path, const request_limits& limits) {
  if (n > limits.max_tokens)
    throw bad_request("'" + path + "' is " + std::to_string(n) + ", above this server's limit of " + std::to_string(limits.max_tokens), path);
}

}  // namespace tandem::api
