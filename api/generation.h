// The part every generating route shares: prompts into tokens, the context and queue checks
// that turn into HTTP errors, submission to the engine, and the per-request clock that feeds
// /metrics (time to first token, inter-token latency, end to end, tokens, outcome).
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "api/server_context.h"
#include "models/chat_template.h"
#include "runtime/engine.h"

namespace tandem::api {

// A raw prompt: BOS as the model wants it, special-token texts parsed (as llama.cpp does for
// prompts, so clients can write a model's FIM or chat markers themselves).
std::vector<int32_t> tokenize_prompt(const runtime::served_model& m, const std::string& text);
// OpenAI's predicted output: no BOS, special-token texts not parsed; 400 naming
// prediction.content when it is longer than the model's context.
std::vector<int32_t> tokenize_prediction(const runtime::served_model& m, const std::string& text);
// The conversation as the model sees it: rendered with its own Jinja template (the request's
// chat_template_kwargs given to the template), else its built-in family, ending with the
// assistant's turn. Throws bad_request naming `messages` when the template refuses the
// conversation or fails on it.
std::string render_chat_text(const runtime::served_model& m, std::span<const models::chat_message> messages,
                             const nlohmann::ordered_json& template_kwargs = nlohmann::ordered_json::object());
// Renders a conversation with the model's own Jinja template (its chat_template_kwargs given
// to the template), else its built-in family, and tokenizes it. Throws bad_request naming
// `messages` when the template refuses the conversation or fails on it.
std::vector<int32_t> tokenize_chat(const runtime::served_model& m, std::span<const models::chat_message> messages,
                                   const nlohmann::ordered_json& template_kwargs = nlohmann::ordered_json::object());

struct submission {
  std::shared_ptr<runtime::request_handle> handle;
  int64_t prompt_tokens = 0;
  int64_t max_tokens = 0;  // as submitted
};

// Fits max_tokens to the context (-1: what is left of it, capped by the server's limit),
// submits, and throws api_error: 400 context_length_exceeded (naming both sizes), 400 for an
// empty prompt, 429 with Retry-After when the model's queue is full.
submission submit_generation(server_context& ctx, const runtime::served_model& m, std::vector<int32_t> prompt, runtime::generation_params params);

// Timings of one request, recorded into the metrics when it ends.
class request_clock {
 public:
  using clock = std::chrono::steady_clock;
  // `arrived`: when the request was read (http_request::received_at), so tokenizing and
  // templating count in the first token's latency.
  request_clock(server_context& ctx, std::string model, std::string route, int64_t prompt_tokens, clock::time_point arrived);
  void token(clock::time_point at);  // the engine released a generated token at `at`
  // Records the request: outcome (stop, length, cancelled, error, disconnected), tokens, times.
  void finish(runtime::finish_reason why, bool client_gone);
  int64_t generated() const { return generated_; }
  int64_t prompt_tokens() const { return prompt_tokens_; }
  double prompt_ms() const;   // until the first token (the whole request when there was none)
  double predict_ms() const;  // from the first token to the last
  double total_ms() const;
  clock::time_point start() const { return start_; }

 private:
  server_context& ctx_;
  std::string model_, route_;
  int64_t prompt_tokens_ = 0, generated_ = 0;
  clock::time_point start_, first_{}, last_{};
  bool done_ = false;
};

// OpenAI's finish_reason for an engine outcome: "stop" or "length".
const char* openai_finish_reason(runtime::finish_reason r);
// A random id with a prefix ("chatcmpl-", "cmpl-").
std::string make_id(const char* prefix);
int64_t unix_seconds();
// RFC 3339 with nanoseconds in UTC, as Ollama writes created_at.
std::string rfc3339_now();
std::string rfc3339(std::chrono::system_clock::time_point t);

}  // namespace tandem::api
