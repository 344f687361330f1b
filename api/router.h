// The route table: method and path to handler, authentication (inference keys for the model
// routes, admin keys for /admin), and errors turned into responses in the shape of the
// route's family (OpenAI's error object, or Ollama's {"error": "..."} under /api/).
#pragma once

#include <functional>
#include <optional>

#include "api/http_types.h"
#include "api/server_context.h"

namespace tandem::api {

route_handler make_router(server_context& ctx);
// The same checks of origin and keys on a request's headers alone, for
// http_server_config::admit: refused requests are answered before their body is read.
std::function<std::optional<http_response>(const http_request&)> make_admission(server_context& ctx);

// The error response for a thrown api_error, in the family of `path`.
http_response error_response(const std::string& path, int status, const std::string& type, const std::string& message, const std::string& param = {},
                             const std::string& code = {}, int retry_after_s = 0);

}  // namespace tandem::api
