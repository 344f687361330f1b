// Parsing of Ollama's native request bodies: POST /api/generate and /api/chat. Lenient where
// Ollama is (unknown top-level keys are ignored, as Go's JSON decoding ignores them) and
// strict on what it knows: a known field of the wrong type, an unknown key inside `options`, or
// a feature this server lacks (format, images, template, tools, context) is a 400 api_error
// (invalid_request_error) naming the field. Null counts as absent.
//
// Defaults are Ollama's: stream true; temperature 0.8, top_k 40, top_p 0.9, min_p 0,
// repeat_penalty 1.1, repeat_last_n 64; num_predict unbounded.
#pragma once

#include <chrono>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "api/generation_request.h"

namespace tandem::api {

// How long the model stays loaded after the request (Ollama's keep_alive).
struct keep_alive {
  bool forever = false;                // a negative duration: never unload for idleness
  std::chrono::milliseconds after{0};  // when !forever; 0: unload as soon as the request is done
};

struct ollama_request {
  parsed_generation gen;  // generate: prompt (when given) and suffix; chat: messages
  // generate only: the system prompt to render the template with (chat puts it first in
  // gen.messages instead).
  std::optional<std::string> system;
  std::optional<api::keep_alive> keep_alive;  // absent: the server's default
  bool raw = false;                           // generate: the prompt goes to the model as is, without the template
  // Nothing to generate (generate: no prompt and no suffix; chat: no messages): load the model,
  // or unload it when keep_alive is 0. gen.params is still filled in.
  bool load_only = false;
};

// /api/generate: model, prompt, suffix, system, raw, stream, keep_alive, options.
ollama_request parse_ollama_generate(const nlohmann::json& body, const request_limits& limits);
// /api/chat: model, messages (roles system | user | assistant; content a string), stream,
// keep_alive, options; a `system` field becomes a system message before the others.
ollama_request parse_ollama_chat(const nlohmann::json& body, const request_limits& limits);

// keep_alive as Ollama takes it: a Go duration string ("10m", "1h30m", "300ms", "1.5h"; units
// ns, us, ms, s, m, h), a bare number string ("-1", "3600": seconds), or a JSON number of
// seconds. Negative: forever; 0: unload now. nullopt for null. Throws a 400 api_error (param
// keep_alive) for anything else, the empty string included.
std::optional<keep_alive> parse_keep_alive(const nlohmann::json& v);

}  // namespace tandem::api
