// Parsing of OpenAI-style request bodies: POST /v1/completions and /v1/chat/completions.
// Strict as OpenAI is: unknown keys, features this server lacks (n > 1, tools, images) and out-of-range values are 400 invalid_request_error naming
// the field, never silently ignored. Null counts as absent for every optional field.
//
// Sampling defaults are OpenAI's (temperature 1, top_p 1, top-k and min-p off, no penalties);
// the penalties' window is the sampler's default (the last 64 tokens, as llama.cpp's server).
// vLLM's and llama.cpp's extras are accepted: top_k (0 or -1: off), min_p,
// repetition_penalty / repeat_penalty (repetition_penalty wins when both are given), and
// ignore_eos (generate past end-of-generation tokens), and llama.cpp's grammar (GBNF) and
// json_schema beside OpenAI's response_format (constraint.h).
#pragma once

#include <nlohmann/json.hpp>

#include "api/generation_request.h"

namespace tandem::api {

// /v1/completions. prompt: a string, [string] or [[int]] of exactly one prompt, or [int]
// (token ids); sets prompt or prompt_tokens. suffix: FIM suffix. max_tokens defaults to 16.
// Throws api_error (400); a missing model gives "you must provide a model parameter" (param
// model), so a route that fills in a default model can insert it before parsing.
parsed_generation parse_completion_request(const nlohmann::json& body, const request_limits& limits);

// /v1/chat/completions. messages: roles system | developer (-> system) | user | assistant,
// content a string or text parts (concatenated without separator); sets messages.
// max_completion_tokens takes precedence over max_tokens; unbounded (-1) when neither is given.
parsed_generation parse_chat_request(const nlohmann::json& body, const request_limits& limits);

}  // namespace tandem::api
