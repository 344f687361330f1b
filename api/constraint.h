// Structured output as requests ask for it: OpenAI's response_format (json_object,
// json_schema), llama.cpp's grammar (GBNF) and json_schema, Ollama's format ("json" or a
// schema). Parsing checks the shapes; compiling turns the request into a runtime::grammar,
// reading the schema again from the body in its own key order (properties are generated in the
// order the schema lists them). Errors are 400 api_errors naming the field.
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <string>
#include <vector>

#include "runtime/grammar.h"

namespace tandem::api {

struct constraint_request {
  enum class kind { none, json_object, json_schema, gbnf };
  kind k = kind::none;
  std::vector<std::string> schema_path;  // json_schema: keys from the body's root to the schema
  std::string gbnf;                      // gbnf: the grammar's text
  std::string param;                     // the field an error names
};

// OpenAI: response_format {type: text | json_object | json_schema, json_schema: {name,
// description?, schema?, strict?}}.
void read_response_format(const nlohmann::json& body, constraint_request& c);
// llama.cpp: grammar (GBNF text) or json_schema (an object); not both, and not beside another
// constraint.
void read_llama_constraint(const nlohmann::json& body, constraint_request& c);
// Ollama: format "json" (any object) or a JSON Schema object; "" is none.
void read_ollama_format(const nlohmann::json& body, constraint_request& c);

// The grammar asked for (nullptr for none). `body` is the request body the request was parsed
// from. Throws bad_request naming constraint_request::param for a schema with what is not
// supported or a grammar that does not parse.
std::shared_ptr<const runtime::grammar> compile_constraint(const constraint_request& c, const std::string& body);

}  // namespace tandem::api
