// Readers for the generation fields the request formats share (sampling, seed, stop strings,
// the token bound), so that OpenAI, Ollama and /infill requests agree on ranges and messages.
// Errors are 400 api_errors naming the field's path, as in json_fields.h.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/generation_request.h"
#include "runtime/sampler.h"

namespace tandem::api {

// A seed from std::random_device (64 bits from two draws): what a request without a seed gets,
// so that repeated requests differ, as with OpenAI.
uint64_t random_seed();

// seed: the given value, or random_seed() when absent, null or -1 (json_fields.h optional_seed).
void read_seed(const nlohmann::json& obj, std::string_view parent, runtime::sampling_params& p);
// presence_penalty and frequency_penalty, each in [-2, 2], when present.
void read_penalties(const nlohmann::json& obj, std::string_view parent, runtime::sampling_params& p);
// A repetition penalty under `key`: finite and > 0 (1 is off).
std::optional<float> optional_repeat_penalty(const nlohmann::json& obj, std::string_view key, std::string_view parent = {});

// llama.cpp's sampling names, as Ollama's options and /infill use them, read over p (the
// route's defaults): temperature (finite, >= 0), top_k (<= 0: off), top_p and min_p ([0, 1]),
// seed, repeat_penalty, repeat_last_n (>= -1), presence_penalty, frequency_penalty.
void read_llama_sampling(const nlohmann::json& obj, std::string_view parent, runtime::sampling_params& p);

// Checks one stop string (found at `path`): the engine cannot stop on an empty one.
std::string as_stop_string(const nlohmann::json& v, const std::string& path);
// An array of at most max_count non-empty stop strings under `key`; empty when absent or null.
std::vector<std::string> read_stop_array(const nlohmann::json& obj, std::string_view key, std::string_view parent, size_t max_count = SIZE_MAX);

// The request's own bound on generated tokens (already checked to be >= 0) against the server's
// cap: throws "'KEY' is N, above this server's limit of CAP" naming `path`.
void check_token_cap(int64_t n, const std::string& path, const request_limits& limits);

}  // namespace tandem::api
