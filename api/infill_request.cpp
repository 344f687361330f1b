#include "api/infill_request.h"

#include <algorithm>
#include <climits>
#include <limits>

#include "api/api_error.h"
#include "api/generation_fields.h"
#include "api/json_fields.h"

namespace tandem::api {
namespace {

using json = nlohmann::json;

constexpr int64_t k_int64_max = std::numeric_limits<int64_t>::max();

std::vector<infill_chunk> read_extra(const json& body) {
  const json* list = optional_array(body, "input_extra");
  if (!list) return {};
  std::vector<infill_chunk> out;
  out.reserve(list->size());
  for (size_t i = 0; i < list->size(); ++i) {
    const std::string path = index_path("input_extra", i);
    expect_object((*list)[i], path);
    infill_chunk c;
    c.text = require_string((*list)[i], "text", path);
    if (auto name = optional_string((*list)[i], "filename", path)) c.filename = std::move(*name);
    out.push_back(std::move(c));
  }
  return out;
}

// The fields /infill and /completion share.
void read_llama_fields(const json& body, const request_limits& limits, infill_request& r) {
  parsed_generation& g = r.gen;
  g.model = optional_string(body, "model").value_or("");
  // sampling_params' defaults are llama.cpp's, which are this route's.
  g.params.sampling = runtime::sampling_params{};
  read_llama_sampling(body, {}, g.params.sampling);
  g.params.stop = read_stop_array(body, "stop", {});
  g.params.max_tokens = -1;
  if (auto n = optional_integer(body, "n_predict", -1, k_int64_max); n && *n >= 0) {
    check_token_cap(*n, "n_predict", limits);
    g.params.max_tokens = *n;
    g.max_tokens_given = true;
  }
  g.stream = optional_bool(body, "stream").value_or(false);
  read_llama_constraint(body, g.constraint);

  r.cache_prompt = optional_bool(body, "cache_prompt").value_or(true);
  r.t_max_predict_ms = optional_integer(body, "t_max_predict_ms", 0, k_int64_max).value_or(0);
  r.t_max_prompt_ms = optional_integer(body, "t_max_prompt_ms", 0, k_int64_max).value_or(0);
  r.n_indent = optional_integer(body, "n_indent", 0, k_int64_max).value_or(0);
  r.id_slot = optional_integer(body, "id_slot", -1, k_int64_max).value_or(-1);
  r.samplers = optional_string_array(body, "samplers").value_or(std::vector<std::string>{});
  r.response_fields = optional_string_array(body, "response_fields").value_or(std::vector<std::string>{});
  // llama.vscode asks for 3 alternatives by default; one completion is served (the response
  // is a single object either way), rather than refusing the plugin's every request.
  optional_integer(body, "n_cmpl", 1, 16);
}

}  // namespace

infill_request parse_infill(const json& body, const request_limits& limits) {
  expect_object(body, "");
  infill_request r;
  read_llama_fields(body, limits, r);
  r.input_prefix = require_string(body, "input_prefix");
  r.input_suffix = require_string(body, "input_suffix");
  r.prompt = optional_string(body, "prompt").value_or("");
  r.input_extra = read_extra(body);
  return r;
}

infill_request parse_llama_completion(const json& body, const request_limits& limits) {
  expect_object(body, "");
  infill_request r;
  read_llama_fields(body, limits, r);
  const json* p = find_field(body, "prompt");
  if (!p || p->is_null()) throw bad_request("'prompt' is required", "prompt");
  if (p->is_string()) {
    r.gen.prompt = p->get<std::string>();
  } else if (p->is_array() && !p->empty() && std::all_of(p->begin(), p->end(), [](const json& t) { return t.is_number_integer(); })) {
    std::vector<int32_t> ids;
    for (size_t i = 0; i < p->size(); ++i) ids.push_back(static_cast<int32_t>(as_integer((*p)[i], index_path("prompt", i), 0, INT32_MAX)));
    r.gen.prompt_tokens = std::move(ids);
  } else {
    throw bad_request("'prompt' must be a string or a non-empty array of token ids", "prompt");
  }
  return r;
}

}  // namespace tandem::api
