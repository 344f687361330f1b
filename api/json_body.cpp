#include "api/json_body.h"

#include "api/api_error.h"

namespace tandem::api {

nlohmann::json parse_json_object(const http_request& r) {
  if (r.body.empty()) throw bad_request("the request body is empty; expected a JSON object");
  nlohmann::json j;
  // No request needs deep nesting; a body of "[[[[..." would cost tens of bytes of memory per
  // byte sent. (nlohmann parses and destroys iteratively: depth cannot overflow the stack.)
  constexpr int k_max_depth = 64;
  bool too_deep = false;
  try {
    j = nlohmann::json::parse(r.body, [&](int depth, nlohmann::json::parse_event_t, nlohmann::json&) {
      if (depth > k_max_depth) too_deep = true;
      return !too_deep;
    });
  } catch (const nlohmann::json::parse_error& e) {
    throw bad_request("the request body is not valid JSON (byte " + std::to_string(e.byte) + ")");
  }
  if (too_deep) throw bad_request("the request body nests JSON deeper than " + std::to_string(k_max_depth) + " levels");
  if (!j.is_object()) throw bad_request("the request body must be a JSON object");
  return j;
}

}  // namespace tandem::api
