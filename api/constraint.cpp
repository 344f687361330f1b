#include "api/constraint.h"

#include "api/api_error.h"
#include "api/json_fields.h"
#include "runtime/json_schema.h"

namespace tandem::api {

namespace {

using json = nlohmann::json;

void claim(constraint_request& c, const std::string& param) {
  if (c.k != constraint_request::kind::none) throw bad_request("'" + param + "' and '" + c.param + "' both constrain the output; give one", param);
  c.param = param;
}

void schema_at(constraint_request& c, std::vector<std::string> path, const std::string& param) {
  claim(c, param);
  c.k = constraint_request::kind::json_schema;
  c.schema_path = std::move(path);
}

}  // namespace

void read_response_format(const json& body, constraint_request& c) {
  const json* format = optional_object(body, "response_format");
  if (!format) return;
  reject_unknown_keys(*format, std::vector<std::string_view>{"type", "json_schema"}, "response_format");
  const std::string type = require_string(*format, "type", "response_format");
  if (type == "text") return;
  if (type == "json_object") {
    claim(c, "response_format");
    c.k = constraint_request::kind::json_object;
    return;
  }
  if (type != "json_schema")
    throw bad_request("'response_format.type' must be \"text\", \"json_object\" or \"json_schema\", got '" + type + "'", "response_format.type");
  const json* js = optional_object(*format, "json_schema", "response_format");
  if (!js) throw bad_request("'response_format.json_schema' is required when the type is json_schema", "response_format.json_schema");
  reject_unknown_keys(*js, std::vector<std::string_view>{"name", "description", "schema", "strict"}, "response_format.json_schema");
  const std::string name = require_string(*js, "name", "response_format.json_schema");
  if (name.empty() || name.size() > 64 ||
      name.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-") != std::string::npos)
    throw bad_request("'response_format.json_schema.name' must be 1 to 64 of a-z, A-Z, 0-9, _ and -", "response_format.json_schema.name");
  (void)optional_string(*js, "description", "response_format.json_schema");
  (void)optional_bool(*js, "strict", "response_format.json_schema");
  if (const json* s = find_field(*js, "schema")) {
    if (!s->is_object() && !s->is_boolean())
      throw bad_request("'response_format.json_schema.schema' must be an object", "response_format.json_schema.schema");
    schema_at(c, {"response_format", "json_schema", "schema"}, "response_format.json_schema.schema");
  } else {
    claim(c, "response_format.json_schema");  // no schema: any JSON object, as json_object
    c.k = constraint_request::kind::json_object;
  }
}

void read_llama_constraint(const json& body, constraint_request& c) {
  if (const auto g = optional_string(body, "grammar"); g && !g->empty()) {
    claim(c, "grammar");
    c.k = constraint_request::kind::gbnf;
    c.gbnf = *g;
  }
  if (const json* s = find_field(body, "json_schema"); s && !s->is_null()) {
    if (!s->is_object() && !s->is_boolean()) throw bad_request("'json_schema' must be an object", "json_schema");
    schema_at(c, {"json_schema"}, "json_schema");
  }
}

void read_ollama_format(const json& body, constraint_request& c) {
  const json* f = find_field(body, "format");
  if (!f || f->is_null()) return;
  if (f->is_string()) {
    const auto& s = f->get_ref<const std::string&>();
    if (s.empty()) return;
    if (s != "json") throw bad_request("'format' must be \"json\" or a JSON schema object, got '" + s + "'", "format");
    claim(c, "format");
    c.k = constraint_request::kind::json_object;
    return;
  }
  if (!f->is_object()) throw bad_request("'format' must be \"json\" or a JSON schema object", "format");
  schema_at(c, {"format"}, "format");
}

std::shared_ptr<const runtime::grammar> compile_constraint(const constraint_request& c, const std::string& body) {
  using kind = constraint_request::kind;
  if (c.k == kind::none) return nullptr;
  std::string text;
  try {
    if (c.k == kind::json_object) {
      text = runtime::json_schema_to_gbnf(nlohmann::ordered_json::parse(R"({"type": "object"})"));
    } else if (c.k == kind::gbnf) {
      text = c.gbnf;
    } else {
      // The parse that checked the request sorted keys; the schema's own order comes from here.
      const auto doc = nlohmann::ordered_json::parse(body);
      const nlohmann::ordered_json* at = &doc;
      for (const auto& key : c.schema_path) at = &at->at(key);
      text = runtime::json_schema_to_gbnf(*at);
    }
    return std::make_shared<const runtime::grammar>(runtime::parse_gbnf(text));
  } catch (const runtime::schema_error& e) {
    throw bad_request(std::string("'") + c.param + "': " + e.what(), c.param);
  } catch (const runtime::grammar_error& e) {
    throw bad_request(std::string("'") + c.param + "': " + e.what(), c.param);
  } catch (const nlohmann::json::exception& e) {
    throw bad_request(std::string("'") + c.param + "' could not be read: " + e.what(), c.param);
  }
}

}  // namespace tandem::api
