// The one error type of the API layer: an HTTP status with the fields of OpenAI's error
// object. Parsing and validation throw it; the router turns it into the response body of the
// route's family (OpenAI's {"error":{message,type,param,code}}, Ollama's {"error":"..."}).
#pragma once

#include <stdexcept>
#include <string>

namespace tandem::api {

struct api_error : std::runtime_error {
  int status;
  std::string type;       // OpenAI's type string: invalid_request_error, authentication_error, ...
  std::string param;      // the offending field ("messages[0].role"); empty when none
  std::string code;       // OpenAI's machine code ("model_not_found"); empty when none
  int retry_after_s = 0;  // > 0: sent as Retry-After (429, 503)

  api_error(int status_, std::string type_, std::string message, std::string param_ = {}, std::string code_ = {})
      : std::runtime_error(std::move(message)), status(status_), type(std::move(type_)), param(std::move(param_)), code(std::move(code_)) {}
};

// 400 invalid_request_error naming the field.
inline api_error bad_request(std::string message, std::string param = {}) {
  return api_error(400, "invalid_request_error", std::move(message), std::move(param));
}

}  // namespace tandem::api
