#include "api/openai_request.h"

#include <array>
#include <limits>
#include <string_view>
#include <vector>

#include "api/api_error.h"
#include "api/generation_fields.h"
#include "api/json_fields.h"

namespace tandem::api {
namespace {

using json = nlohmann::json;

// Keys both routes accept. The second group is accepted and ignored: bookkeeping that changes
// nothing about the output (user, store, ...), or llama.cpp extras clients send by habit; each
// is still type-checked, and rejected where a value would ask for something not done.
constexpr std::string_view k_common_keys[] = {"model",
                                              "max_tokens",
                                              "temperature",
                                              "top_p",
                                              "top_k",
                                              "min_p",
                                              "seed",
                                              "presence_penalty",
                                              "frequency_penalty",
                                              "repetition_penalty",
                                              "repeat_penalty",
                                              "ignore_eos",
                                              "stop",
                                              "stream",
                                              "stream_options",
                                              "n",
                                              "logprobs",
                                              "logit_bias",
                                              "response_format",
                                              "user",
                                              "store",
                                              "metadata",
                                              "service_tier",
                                              "parallel_tool_calls",
                                              "cache_prompt",
                                              "id_slot",
                                              "n_probs",
                                              "reasoning_effort",
                                              "modalities",
                                              "prediction",
                                              "speculate",
                                              "grammar",
                                              "json_schema"};
constexpr std::string_view k_completion_keys[] = {"prompt", "suffix", "echo", "best_of"};
constexpr std::string_view k_chat_keys[] = {"messages",  "max_completion_tokens", "top_logprobs",  "tools",
                                            "functions", "tool_choice",           "function_call", "chat_template_kwargs"};
constexpr int64_t k_max_top_logprobs = 20;  // OpenAI's limit on top_logprobs
constexpr std::string_view k_stream_option_keys[] = {"include_usage", "continuous_usage_stats"};

template <size_t A, size_t B>
constexpr std::array<std::string_view, A + B> join(const std::string_view (&a)[A], const std::string_view (&b)[B]) {
  std::array<std::string_view, A + B> out{};
  for (size_t i = 0; i < A; ++i) out[i] = a[i];
  for (size_t i = 0; i < B; ++i) out[A + i] = b[i];
  return out;
}

constexpr auto k_completion_all = join(k_common_keys, k_completion_keys);
constexpr auto k_chat_all = join(k_common_keys, k_chat_keys);

constexpr int64_t k_int32_max = std::numeric_limits<int32_t>::max();
constexpr int64_t k_int64_max = std::numeric_limits<int64_t>::max();

[[noreturn]] void unsupported(const std::string& what, const std::string& param) {
  throw bad_request(what + " is not supported by this server", param);
}

std::string read_model(const json& body) {
  const json* v = find_field(body, "model");
  // An empty name is no name: OpenAI answers both the same way.
  if (!v || (v->is_string() && v->get_ref<const std::string&>().empty())) throw bad_request("you must provide a model parameter", "model");
  return as_string(*v, "model");
}

// OpenAI's defaults, not the sampler's (which are llama.cpp's CLI ones).
void read_sampling(const json& body, runtime::sampling_params& p) {
  p.temperature = 1.0f;
  p.top_p = 1.0f;
  p.top_k = 0;
  p.min_p = 0.0f;
  p.repeat_penalty = 1.0f;
  if (auto v = optional_number(body, "temperature", 0, 2)) p.temperature = static_cast<float>(*v);
  if (auto v = optional_number(body, "top_p", 0, 1)) p.top_p = static_cast<float>(*v);
  // vLLM's convention: 0 and -1 both mean off.
  if (auto v = optional_integer(body, "top_k", -1, k_int32_max)) p.top_k = *v < 0 ? 0 : static_cast<int>(*v);
  if (auto v = optional_number(body, "min_p", 0, 1)) p.min_p = static_cast<float>(*v);
  read_penalties(body, {}, p);
  if (auto v = optional_repeat_penalty(body, "repeat_penalty")) p.repeat_penalty = *v;
  if (auto v = optional_repeat_penalty(body, "repetition_penalty")) p.repeat_penalty = *v;
  read_seed(body, {}, p);
}

// max_tokens / max_completion_tokens: >= 1 (OpenAI rejects 0) and within the server's cap.
std::optional<int64_t> read_max_tokens(const json& body, std::string_view key, const request_limits& limits) {
  auto v = optional_integer(body, key, 1, k_int64_max);
  if (v) check_token_cap(*v, std::string(key), limits);
  return v;
}

std::vector<std::string> read_stop(const json& body) {
  const json* v = find_field(body, "stop");
  if (!v) return {};
  if (v->is_string()) return {as_stop_string(*v, "stop")};
  if (!v->is_array()) throw bad_request("'stop' must be a string or an array of strings", "stop");
  return read_stop_array(body, "stop", {}, 4);  // OpenAI's limit
}

void read_stream(const json& body, parsed_generation& g) {
  g.stream = optional_bool(body, "stream").value_or(false);
  const json* opts = optional_object(body, "stream_options");
  if (!opts) return;
  if (!g.stream) throw bad_request("stream_options can only be set when stream is true", "stream_options");
  reject_unknown_keys(*opts, k_stream_option_keys, "stream_options");
  g.include_usage = optional_bool(*opts, "include_usage", "stream_options").value_or(false);
  optional_bool(*opts, "continuous_usage_stats", "stream_options");  // vLLM's; usage comes once, at the end
}

// Fields whose only acceptable values ask for nothing beyond one plain text answer.
void reject_unsupported_common(const json& body) {
  if (auto n = optional_integer(body, "n", std::numeric_limits<int64_t>::min(), k_int64_max); n && *n != 1)
    throw bad_request("only n=1 is supported", "n");
  if (const json* bias = optional_object(body, "logit_bias"); bias && !bias->empty()) unsupported("logit_bias", "logit_bias");

  // Accepted and ignored; type-checked so that a malformed body still fails loudly.
  optional_string(body, "user");
  optional_bool(body, "store");
  optional_object(body, "metadata");
  optional_string(body, "service_tier");
  optional_bool(body, "parallel_tool_calls");
  optional_bool(body, "cache_prompt");  // the prefix cache is always on
  optional_integer(body, "id_slot", -1, k_int64_max);
  if (optional_integer(body, "n_probs", 0, k_int64_max).value_or(0) != 0) unsupported("n_probs", "n_probs");
  if (find_field(body, "reasoning_effort")) unsupported("reasoning_effort", "reasoning_effort");
  if (auto modalities = optional_string_array(body, "modalities"))
    for (const std::string& m : *modalities)
      if (m != "text") throw bad_request("only the \"text\" modality is supported", "modalities");
}

std::string read_content_parts(const json& parts, const std::string& msg_path);

// OpenAI's predicted outputs: {type: "content", content: text or text parts}.
std::optional<std::string> read_prediction(const json& body) {
  const json* v = find_field(body, "prediction");
  if (!v || v->is_null()) return std::nullopt;
  if (!v->is_object()) throw bad_request("'prediction' must be an object {\"type\": \"content\", \"content\": ...}", "prediction");
  constexpr std::string_view keys[] = {"type", "content"};
  reject_unknown_keys(*v, keys, "prediction");
  const std::string type = require_string(*v, "type", "prediction");
  if (type != "content") throw bad_request("'prediction.type' must be \"content\", got '" + type + "'", "prediction.type");
  const json* c = find_field(*v, "content");
  if (!c) throw bad_request("'prediction.content' is required", "prediction.content");
  if (c->is_string()) return c->get<std::string>();
  if (c->is_array()) return read_content_parts(*c, "prediction");
  throw bad_request("'prediction.content' must be a string or an array of text parts", "prediction.content");
}

void read_common(const json& body, parsed_generation& g) {
  g.model = read_model(body);
  read_sampling(body, g.params.sampling);
  g.params.stop = read_stop(body);
  // vLLM's and llama.cpp's extra: generate past end-of-generation tokens (benchmarks).
  g.params.stop_at_eog = !optional_bool(body, "ignore_eos").value_or(false);
  read_stream(body, g);
  reject_unsupported_common(body);
  read_response_format(body, g.constraint);
  read_llama_constraint(body, g.constraint);
  g.prediction = read_prediction(body);
  // tandem's extra: no speculation for this request (the model's speculate: setting otherwise).
  if (auto v = optional_bool(body, "speculate")) g.params.speculate = *v;
}

// [int]: token ids, non-empty, each in [0, INT32_MAX].
std::vector<int32_t> as_tokens(const json& v, const std::string& path) {
  if (v.empty()) throw bad_request("'" + path + "' must not be empty", path);
  std::vector<int32_t> tokens;
  tokens.reserve(v.size());
  for (size_t i = 0; i < v.size(); ++i) tokens.push_back(static_cast<int32_t>(as_integer(v[i], index_path(path, i), 0, k_int32_max)));
  return tokens;
}

void read_prompt(const json& body, parsed_generation& g) {
  const json* v = find_field(body, "prompt");
  if (!v) throw bad_request("'prompt' is required", "prompt");
  if (v->is_string()) {
    g.prompt = v->get<std::string>();
    return;
  }
  const char* shape = "'prompt' must be a string, an array of strings, an array of token ids or an array of arrays of token ids";
  if (!v->is_array()) throw bad_request(shape, "prompt");
  if (v->empty()) throw bad_request("'prompt' must not be empty", "prompt");
  const json& first = v->front();
  if (first.is_number()) {
    g.prompt_tokens = as_tokens(*v, "prompt");
    return;
  }
  if (!first.is_string() && !first.is_array()) throw bad_request(shape, "prompt");
  // A batch of prompts would need one choice per prompt; this server answers one.
  if (v->size() > 1) throw bad_request("only one prompt per request is supported", "prompt");
  if (first.is_string())
    g.prompt = first.get<std::string>();
  else
    g.prompt_tokens = as_tokens(first, "prompt[0]");
}

// A content part array: text parts only, concatenated.
std::string read_content_parts(const json& parts, const std::string& msg_path) {
  const std::string path = msg_path + ".content";
  std::string text;
  for (size_t j = 0; j < parts.size(); ++j) {
    const std::string part_path = index_path(path, j);
    expect_object(parts[j], part_path);
    const std::string type = require_string(parts[j], "type", part_path);
    if (type == "text") {
      text += require_string(parts[j], "text", part_path);
    } else if (type == "image_url" || type == "input_audio" || type == "file" || type == "image" || type == "audio") {
      throw bad_request("'" + path + "' has a part of type '" + type + "': only text is supported", path);
    } else {
      throw bad_request("'" + part_path + ".type' must be \"text\", got '" + type + "'", part_path + ".type");
    }
  }
  return text;
}

std::vector<models::chat_message> read_messages(const json& body) {
  const json* list = optional_array(body, "messages");
  if (!list) throw bad_request("'messages' is required", "messages");
  if (list->empty()) throw bad_request("'messages' must not be empty", "messages");
  std::vector<models::chat_message> out;
  out.reserve(list->size());
  for (size_t i = 0; i < list->size(); ++i) {
    const json& m = (*list)[i];
    const std::string path = index_path("messages", i);
    expect_object(m, path);
    std::string role = require_string(m, "role", path);
    if (role == "tool" || role == "function")
      throw bad_request("messages with role '" + role + "' are not supported (this server has no tool calling)", path + ".role");
    if (role == "developer") role = "system";  // OpenAI's newer name for the system prompt
    if (role != "system" && role != "user" && role != "assistant")
      throw bad_request("'" + path + ".role' must be one of system, developer, user, assistant; got '" + role + "'", path + ".role");
    if (const json* calls = optional_array(m, "tool_calls", path); calls && !calls->empty()) unsupported("tool_calls", path + ".tool_calls");
    if (find_field(m, "function_call")) unsupported("function_call", path + ".function_call");

    std::string content;
    const json* c = find_field(m, "content");
    if (!c) {
      // An assistant turn that only called tools has no content; the others must say something.
      if (role != "assistant") throw bad_request("'" + path + ".content' is required", path + ".content");
    } else if (c->is_string()) {
      content = c->get<std::string>();
    } else if (c->is_array()) {
      content = read_content_parts(*c, path);
    } else {
      throw bad_request("'" + path + ".content' must be a string or an array of content parts", path + ".content");
    }
    out.push_back({std::move(role), std::move(content)});
  }
  return out;
}

// tool_choice / function_call: only the values that call nothing ("none"; "auto" with no tools,
// which tools being rejected guarantees).
void read_tool_choice(const json& body, std::string_view key) {
  const json* v = find_field(body, key);
  if (!v) return;
  const std::string path(key);
  if (v->is_string()) {
    const auto& s = v->get_ref<const std::string&>();
    if (s == "none" || s == "auto") return;
    if (s == "required") unsupported(path + " 'required'", path);
    throw bad_request("'" + path + "' must be \"none\", \"auto\", \"required\" or an object", path);
  }
  if (v->is_object()) unsupported("forcing a function call with " + path, path);
  throw bad_request("'" + path + "' must be a string or an object", path);
}

}  // namespace

parsed_generation parse_completion_request(const json& body, const request_limits& limits) {
  expect_object(body, "");
  reject_unknown_keys(body, k_completion_all);
  parsed_generation g;
  read_common(body, g);
  read_prompt(body, g);
  g.suffix = optional_string(body, "suffix");

  g.params.max_tokens = 16;  // OpenAI's and vLLM's default for this route
  if (auto v = read_max_tokens(body, "max_tokens", limits)) {
    g.params.max_tokens = *v;
    g.max_tokens_given = true;
  }

  if (optional_bool(body, "echo").value_or(false)) unsupported("echo", "echo");
  if (auto v = optional_integer(body, "best_of", std::numeric_limits<int64_t>::min(), k_int64_max); v && *v != 1)
    throw bad_request("only best_of=1 is supported", "best_of");
  // The legacy form: the number of most likely tokens to list beside each sampled one's.
  if (auto v = optional_integer(body, "logprobs", 0, k_max_top_logprobs)) g.params.logprobs = static_cast<int>(*v);
  return g;
}

parsed_generation parse_chat_request(const json& body, const request_limits& limits) {
  expect_object(body, "");
  reject_unknown_keys(body, k_chat_all);
  parsed_generation g;
  read_common(body, g);
  g.messages = read_messages(body);

  // Both are checked; the newer name wins, as with OpenAI.
  const auto max_tokens = read_max_tokens(body, "max_tokens", limits);
  const auto max_completion = read_max_tokens(body, "max_completion_tokens", limits);
  g.params.max_tokens = -1;
  if (auto v = max_completion ? max_completion : max_tokens) {
    g.params.max_tokens = *v;
    g.max_tokens_given = true;
  }

  const bool logprobs = optional_bool(body, "logprobs").value_or(false);
  const auto top = optional_integer(body, "top_logprobs", 0, k_max_top_logprobs);
  if (top.value_or(0) > 0 && !logprobs) throw bad_request("'top_logprobs' needs 'logprobs': true", "top_logprobs");
  if (logprobs) g.params.logprobs = static_cast<int>(top.value_or(0));
  for (std::string_view key : {"tools", "functions"})
    if (const json* v = optional_array(body, key); v && !v->empty()) unsupported(std::string(key) + " (tool calling)", std::string(key));
  read_tool_choice(body, "tool_choice");
  read_tool_choice(body, "function_call");
  // vLLM's and llama.cpp's: variables for the model's own template (enable_thinking, ...).
  if (const json* kw = find_field(body, "chat_template_kwargs")) {
    if (!kw->is_object() && !kw->is_null()) throw bad_request("'chat_template_kwargs' must be an object", "chat_template_kwargs");
    if (kw->is_object()) g.template_kwargs = nlohmann::ordered_json::parse(kw->dump());
  }
  return g;
}

}  // namespace tandem::api
