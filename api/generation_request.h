// What every generation route's parser hands the route: the model named, the prompt in one of
// its forms, and the engine's generation parameters, validated. The route then picks the
// model, renders messages with its chat template, tokenizes, and submits.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "api/constraint.h"
#include "models/chat_template.h"
#include "runtime/engine.h"

namespace tandem::api {

struct request_limits {
  int64_t max_tokens = 4096;  // server cap on max_tokens / n_predict / num_predict; above it: 400
};

struct parsed_generation {
  std::string model;                  // as named; empty when the field is absent (allowed only where noted)
  std::optional<std::string> prompt;  // text prompt (completions, generate); infill's is in its FIM fields
  // Token-array prompt (completions only): ids >= 0, not yet checked against a vocabulary.
  std::optional<std::vector<int32_t>> prompt_tokens;
  std::optional<std::string> suffix;           // FIM suffix (completions `suffix`, Ollama `suffix`)
  std::vector<models::chat_message> messages;  // chat routes; roles system | user | assistant only
  // Chat: variables for the model's own Jinja template (chat_template_kwargs), an object.
  nlohmann::ordered_json template_kwargs = nlohmann::ordered_json::object();
  // sampling is complete (the route's defaults filled in, seed drawn when the request gave
  // none) and within the sampler's ranges. max_tokens -1: not bounded by the request; the route
  // must replace it (the engine takes >= 0) with what is left of the context, capped by
  // request_limits::max_tokens. 0 (infill, Ollama): evaluate the prompt and generate nothing.
  runtime::generation_params params;
  bool max_tokens_given = false;  // the request bounded max_tokens itself
  bool stream = false;
  bool include_usage = false;  // OpenAI stream_options.include_usage
  // OpenAI's predicted output (prediction.content), as text: the route tokenizes it with the
  // model's tokenizer (no BOS) into params.prediction.
  std::optional<std::string> prediction;
  // Structured output asked for (constraint.h): the route compiles it into params.constraint.
  constraint_request constraint;
};

}  // namespace tandem::api
