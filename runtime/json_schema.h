// JSON Schema -> GBNF (grammar.h), for OpenAI's response_format json_schema, llama.cpp's
// json_schema and Ollama's format. What is supported is generated exactly; anything else is a
// schema_error naming the keyword and where it is, never silently loosened.
//
// Supported: type (one or a list) string / number / integer / boolean / null / object / array;
// properties (in the schema's order: required ones first, then the optional ones, each
// optional), required, additionalProperties (false, or true / a schema on an object without
// properties); items, minItems, maxItems; minLength, maxLength; format date / time / date-time
// / uuid; enum, const; anyOf and oneOf (as anyOf); allOf of one schema; $ref to "#" or a JSON
// pointer within the schema ($defs, definitions); true and {} (any JSON value). Annotations
// (title, description, default, examples, $schema, $id, $comment, deprecated, readOnly,
// writeOnly) are ignored. Whitespace between tokens is one space, or a newline and an indent of
// at most 20 spaces or tabs; numbers to
// 16 digits before and after the point: a model cannot run on in either.
#pragma once

#include <nlohmann/json.hpp>

#include <stdexcept>
#include <string>

namespace tandem::runtime {

struct schema_error : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// The grammar of JSON texts the schema accepts (root rule `root`), leading whitespace allowed.
// Throws schema_error ("... at /properties/x").
std::string json_schema_to_gbnf(const nlohmann::ordered_json& schema);
// Any JSON object (OpenAI's json_object mode, Ollama's "json").
std::string json_object_gbnf();

}  // namespace tandem::runtime
