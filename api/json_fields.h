// Strict, typed readers for fields of a parsed JSON request body. Every failure throws a 400
// api_error (invalid_request_error) whose param is the field's path ("options.top_k",
// "messages[2].content") and whose message names it: "'temperature' must be a number".
//
// Conventions shared by every reader:
// - A field that is absent or JSON null is "not given": optional readers return nullopt or
//   nullptr, required ones throw "'KEY' is required".
// - Numbers must be JSON numbers (never strings); booleans must be true/false (never 0/1).
// - Integers must be integral: 16 and 16.0 are accepted, 16.5 is not.
// - Ranges are inclusive; non-finite numbers are always rejected.
// - `parent` is the path of the object holding the field ("" for the request body).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace tandem::api {

// "options" + "top_k" -> "options.top_k"; "" + "model" -> "model".
std::string field_path(std::string_view parent, std::string_view key);
// "messages" + 2 -> "messages[2]".
std::string index_path(std::string_view array_path, size_t i);

// The value of obj[key], or nullptr when obj lacks it or it is null. obj must be an object.
const nlohmann::json* find_field(const nlohmann::json& obj, std::string_view key);

// Checks on one value found at `path`.
void expect_object(const nlohmann::json& v, const std::string& path);  // path "": the request body
std::string as_string(const nlohmann::json& v, const std::string& path);
bool as_bool(const nlohmann::json& v, const std::string& path);
double as_number(const nlohmann::json& v, const std::string& path, double min, double max);
int64_t as_integer(const nlohmann::json& v, const std::string& path, int64_t min, int64_t max);

// Field readers.
std::string require_string(const nlohmann::json& obj, std::string_view key, std::string_view parent = {});
std::optional<std::string> optional_string(const nlohmann::json& obj, std::string_view key, std::string_view parent = {});
std::optional<bool> optional_bool(const nlohmann::json& obj, std::string_view key, std::string_view parent = {});
std::optional<double> optional_number(const nlohmann::json& obj, std::string_view key, double min, double max, std::string_view parent = {});
std::optional<int64_t> optional_integer(const nlohmann::json& obj, std::string_view key, int64_t min, int64_t max, std::string_view parent = {});
// Non-null results point into obj.
const nlohmann::json* optional_object(const nlohmann::json& obj, std::string_view key, std::string_view parent = {});
const nlohmann::json* optional_array(const nlohmann::json& obj, std::string_view key, std::string_view parent = {});
// An array whose every element is a string (each element's path in errors: "stop[1]").
std::optional<std::vector<std::string>> optional_string_array(const nlohmann::json& obj, std::string_view key, std::string_view parent = {});

// A seed: any integer from INT64_MIN to UINT64_MAX, negatives taken as their two's-complement
// uint64. nullopt when absent, null or -1: every one of them means "draw a random seed"
// (llama.cpp's and Ollama's convention for -1).
std::optional<uint64_t> optional_seed(const nlohmann::json& obj, std::string_view key, std::string_view parent = {});

// Throws "Unrecognized request argument supplied: PATH" (OpenAI's wording) for a key of obj that
// is not in `known` (the first in nlohmann::json's key order, which is alphabetical).
void reject_unknown_keys(const nlohmann::json& obj, std::span<const std::string_view> known, std::string_view parent = {});

}  // namespace tandem::api
