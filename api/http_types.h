// What routes see and return, free of Beast: the request as parsed, and either a whole
// response or a generation the session streams as the engine releases it.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "runtime/request_handle.h"

namespace tandem::api {

struct http_request {
  std::string method;  // "GET", "POST", ...
  std::string path;    // target without the query
  std::string query;   // after '?', undecoded
  std::string body;
  std::string authorization;  // the Authorization header
  std::string content_type;
  std::string host;                 // the Host header
  std::string origin;               // the Origin header (browsers send it on cross-site requests)
  bool loopback = false;            // the client connected from 127.0.0.0/8 or ::1
  bool server_on_loopback = false;  // the server listens on a loopback address
  // The server's admission hook (http_server_config::admit) passed it on its headers already:
  // origin and keys are checked once per request.
  bool admitted = false;
  std::chrono::steady_clock::time_point received_at = std::chrono::steady_clock::now();
};

struct http_response {
  int status = 200;
  std::string content_type = "application/json";
  std::string body;
  std::vector<std::pair<std::string, std::string>> headers;  // extra: Retry-After, WWW-Authenticate
};

// A generation in flight. The session calls on_piece for every piece the handle yields (on the
// session's strand, never on the engine thread), then on_end once the handle has finished,
// then on_close. chunked: the headers go out at once and every string on_piece returns is sent
// as it comes (SSE, NDJSON), on_end's body last; otherwise on_piece accumulates and on_end's
// response is the whole answer. A client that goes away cancels the handle; on_close learns
// whether it did.
struct generation_stream {
  std::shared_ptr<runtime::request_handle> handle;
  bool chunked = false;
  int status = 200;
  std::string content_type;
  std::function<std::string(const runtime::piece&)> on_piece;
  std::function<http_response()> on_end;
  std::function<void(bool client_gone)> on_close;
};

using route_result = std::variant<http_response, generation_stream>;
using route_handler = std::function<route_result(const http_request&)>;

}  // namespace tandem::api
