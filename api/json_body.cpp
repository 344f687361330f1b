#include "api/json_body.h"

#include "api/api_error.h"

namespace tandem::api {

nlohmann::json parse_json_object(const http_request& r) {
  if (r.body.empty()) throw bad_request("the request body is empty; expected a JSON object");
  nlohmann::json j;
  try {
    // nlohmann parses and destroys iteratively: deep nesting cannot overflow the stack.
    j = nlohmann::json::parse(r.body);
  } catch (const nlohmann::json::parse_error& e) {
    throw bad_request("the request body is not valid JSON (byte " + std::to_string(e.byte) + ")");
  }
  if (!j.is_object()) throw bad_request("the request body must be a JSON object");
  return j;
}

}  // namespace tandem::api
