#include "api/ollama_request.h"

#include <cmath>
#include <iterator>
#include <limits>
#include <string_view>
#include <vector>

#include "api/api_error.h"
#include "api/generation_fields.h"
#include "api/json_fields.h"

namespace tandem::api {
namespace {

using json = nlohmann::json;

constexpr int64_t k_int64_min = std::numeric_limits<int64_t>::min();
constexpr int64_t k_int64_max = std::numeric_limits<int64_t>::max();

// Every key Ollama documents under `options`. The first group is read; the second is accepted
// and ignored because it only tunes how the model is loaded or run (threads, batch, GPU layers,
// mmap), or because it cannot change a result here: num_ctx (the context is the model's
// configured one), num_keep (this server never shifts the context), penalize_newline (Ollama
// itself ignores it now), mirostat_tau/eta (unused with mirostat 0). The third group selects
// samplers this server lacks: only the value that turns each off is accepted.
constexpr std::string_view k_option_keys[] = {
    "num_predict",      "temperature",       "top_k",     "top_p",   "min_p",      "seed",       "repeat_penalty",   "repeat_last_n",
    "presence_penalty", "frequency_penalty", "stop",      "num_ctx", "num_batch",  "num_thread", "num_gpu",          "main_gpu",
    "low_vram",         "use_mmap",          "use_mlock", "numa",    "vocab_only", "num_keep",   "penalize_newline", "mirostat_tau",
    "mirostat_eta",     "typical_p",         "mirostat",  "tfs_z"};

[[noreturn]] void unsupported(const std::string& what, const std::string& param) {
  throw bad_request(what + " is not supported by this server", param);
}

std::string read_model(const json& body) {
  const json* v = find_field(body, "model");
  if (!v || (v->is_string() && v->get_ref<const std::string&>().empty())) throw bad_request("model is required", "model");  // Ollama's wording
  return as_string(*v, "model");
}

// A sampler that is off at exactly one value: any other value would change the output.
void only_value(const json& options, std::string_view key, double off) {
  const auto v = optional_number(options, key, -std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity(), "options");
  if (v && *v != off) unsupported("options." + std::string(key) + " other than " + std::to_string(int(off)), field_path("options", key));
}

void read_options(const json& body, const request_limits& limits, parsed_generation& g) {
  auto& p = g.params.sampling;
  p.temperature = 0.8f;
  p.top_k = 40;
  p.top_p = 0.9f;
  p.min_p = 0.0f;
  p.repeat_penalty = 1.1f;
  p.repeat_last_n = 64;
  g.params.max_tokens = -1;
  const json* options = optional_object(body, "options");
  if (!options) {
    p.seed = random_seed();
    return;
  }
  reject_unknown_keys(*options, k_option_keys, "options");
  read_llama_sampling(*options, "options", p);
  g.params.stop = read_stop_array(*options, "stop", "options");

  // -1: until the end of generation; -2: until the context is full. Both are "not bounded" here,
  // since the route stops at the context's end either way.
  if (auto n = optional_integer(*options, "num_predict", -2, k_int64_max, "options"); n && *n >= 0) {
    check_token_cap(*n, "options.num_predict", limits);
    g.params.max_tokens = *n;
    g.max_tokens_given = true;
  }

  for (std::string_view key : {"num_ctx", "num_batch", "num_thread", "num_gpu", "main_gpu", "num_keep"})
    optional_integer(*options, key, k_int64_min, k_int64_max, "options");
  for (std::string_view key : {"low_vram", "use_mmap", "use_mlock", "numa", "vocab_only", "penalize_newline"})
    optional_bool(*options, key, "options");
  for (std::string_view key : {"mirostat_tau", "mirostat_eta"})
    optional_number(*options, key, -std::numeric_limits<double>::infinity(), std::numeric_limits<double>::infinity(), "options");
  only_value(*options, "typical_p", 1);
  only_value(*options, "mirostat", 0);
  only_value(*options, "tfs_z", 1);
}

// The fields both routes share: model, stream (default true), keep_alive, options, and the
// features this server lacks.
ollama_request read_common(const json& body, const request_limits& limits) {
  expect_object(body, "");
  ollama_request r;
  r.gen.model = read_model(body);
  r.gen.stream = optional_bool(body, "stream").value_or(true);
  if (const json* v = find_field(body, "keep_alive")) r.keep_alive = parse_keep_alive(*v);
  read_options(body, limits, r.gen);

  read_ollama_format(body, r.gen.constraint);
  if (const json* think = find_field(body, "think"); think && !(think->is_boolean() && !think->get<bool>())) unsupported("think", "think");
  if (const json* tools = optional_array(body, "tools"); tools && !tools->empty()) unsupported("tools", "tools");
  return r;
}

std::vector<models::chat_message> read_messages(const json& list) {
  std::vector<models::chat_message> out;
  out.reserve(list.size());
  for (size_t i = 0; i < list.size(); ++i) {
    const json& m = list[i];
    const std::string path = index_path("messages", i);
    expect_object(m, path);
    std::string role = require_string(m, "role", path);
    if (role == "tool") throw bad_request("messages with role 'tool' are not supported (this server has no tool calling)", path + ".role");
    if (role != "system" && role != "user" && role != "assistant")
      throw bad_request("'" + path + ".role' must be one of system, user, assistant; got '" + role + "'", path + ".role");
    if (const json* images = optional_array(m, "images", path); images && !images->empty()) unsupported("images", path + ".images");
    if (const json* calls = optional_array(m, "tool_calls", path); calls && !calls->empty()) unsupported("tool_calls", path + ".tool_calls");
    // Go decodes a missing content as "": an assistant turn that only called tools has none.
    out.push_back({std::move(role), optional_string(m, "content", path).value_or("")});
  }
  return out;
}

// One element of a Go duration ("1.5h"): the number's value in seconds per `unit`, or nullopt
// when the unit is unknown. Longest units first, so "ms" is not read as "m".
std::optional<long double> unit_seconds(std::string_view& rest) {
  struct unit {
    std::string_view name;
    long double seconds;
  };
  static constexpr unit units[] = {{"ns", 1e-9L}, {"us", 1e-6L}, {"\xC2\xB5s", 1e-6L}, {"\xCE\xBCs", 1e-6L},
                                   {"ms", 1e-3L}, {"s", 1.0L},   {"m", 60.0L},         {"h", 3600.0L}};
  for (const unit& u : units) {
    if (rest.substr(0, u.name.size()) == u.name) {
      rest.remove_prefix(u.name.size());
      return u.seconds;
    }
  }
  return std::nullopt;
}

// Seconds in a duration string, or nullopt when it is not one. Go's time.ParseDuration syntax
// (a sign, then number-unit pairs; "0" alone), plus a bare number meaning seconds, which
// Ollama's OLLAMA_KEEP_ALIVE takes and clients send ("-1").
std::optional<long double> duration_seconds(std::string_view s) {
  bool negative = false;
  if (!s.empty() && (s[0] == '-' || s[0] == '+')) {
    negative = s[0] == '-';
    s.remove_prefix(1);
  }
  if (s.empty()) return std::nullopt;
  long double total = 0;
  bool first = true;
  while (!s.empty()) {
    long double value = 0, scale = 1;
    bool digits = false, dot = false;
    while (!s.empty() && ((s[0] >= '0' && s[0] <= '9') || (s[0] == '.' && !dot))) {
      if (s[0] == '.') {
        dot = true;
      } else {
        digits = true;
        if (dot)
          value += (s[0] - '0') * (scale /= 10);
        else
          value = value * 10 + (s[0] - '0');
      }
      s.remove_prefix(1);
    }
    if (!digits) return std::nullopt;
    if (s.empty() && first) return negative ? -value : value;  // a bare number: seconds
    const auto unit = unit_seconds(s);
    if (!unit) return std::nullopt;
    total += value * *unit;
    first = false;
  }
  return negative ? -total : total;
}

keep_alive keep_alive_from_seconds(long double seconds) {
  // A thousand years is forever for a server; it also keeps the milliseconds from overflowing.
  constexpr long double forever_s = 1000.0L * 365 * 24 * 3600;
  if (seconds < 0 || seconds > forever_s) return {true, std::chrono::milliseconds(0)};
  // Rounded up, so a positive duration never becomes "unload now".
  return {false, std::chrono::milliseconds(static_cast<int64_t>(std::ceil(seconds * 1000)))};
}

}  // namespace

std::optional<keep_alive> parse_keep_alive(const json& v) {
  if (v.is_null()) return std::nullopt;
  if (v.is_number()) {
    const double s = v.get<double>();
    if (!std::isfinite(s)) throw bad_request("'keep_alive' must be a finite number of seconds", "keep_alive");
    return keep_alive_from_seconds(s);
  }
  if (v.is_string()) {
    const auto& text = v.get_ref<const std::string&>();
    if (auto s = duration_seconds(text)) return keep_alive_from_seconds(*s);
    throw bad_request("'keep_alive' must be a duration such as \"5m\", \"1h30m\" or \"-1\", got \"" + text + "\"", "keep_alive");
  }
  throw bad_request("'keep_alive' must be a duration string or a number of seconds", "keep_alive");
}

ollama_request parse_ollama_generate(const json& body, const request_limits& limits) {
  ollama_request r = read_common(body, limits);
  r.gen.prompt = optional_string(body, "prompt");
  r.gen.suffix = optional_string(body, "suffix");
  r.system = optional_string(body, "system");
  r.raw = optional_bool(body, "raw").value_or(false);
  // Ollama answers an empty prompt with a load; a suffix alone is still a completion (FIM at
  // the very start of a file).
  r.load_only = r.gen.prompt.value_or("").empty() && r.gen.suffix.value_or("").empty();

  if (auto t = optional_string(body, "template"); t && !t->empty()) unsupported("template", "template");
  if (const json* images = optional_array(body, "images"); images && !images->empty()) unsupported("images", "images");
  // The token context of an earlier response, to continue it: this server keeps no such state.
  if (const json* context = optional_array(body, "context"); context && !context->empty()) unsupported("context", "context");
  return r;
}

ollama_request parse_ollama_chat(const json& body, const request_limits& limits) {
  ollama_request r = read_common(body, limits);
  const json* list = optional_array(body, "messages");
  r.load_only = !list || list->empty();
  if (auto system = optional_string(body, "system")) r.gen.messages.push_back({"system", std::move(*system)});
  if (list) {
    auto messages = read_messages(*list);
    r.gen.messages.insert(r.gen.messages.end(), std::make_move_iterator(messages.begin()), std::make_move_iterator(messages.end()));
  }
  return r;
}

}  // namespace tandem::api
