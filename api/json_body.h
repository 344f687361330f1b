// A request body as a JSON object, or api_error 400 saying what is wrong with it.
#pragma once

#include <nlohmann/json.hpp>

#include "api/http_types.h"

namespace tandem::api {

nlohmann::json parse_json_object(const http_request& r);

}  // namespace tandem::api
