// The HTTP/1.1 server: an acceptor and a small pool of threads running Asio, one session per
// connection on its own strand. Sessions read requests under a timeout and a body limit, keep
// connections alive, hand each request to the route handler and write what it returns; a
// generation is streamed as the engine releases it, without a thread waiting on it, and a
// client that goes away cancels it. stop() stops accepting, lets generations finish until a
// deadline, cancels the rest, and closes every connection.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "api/http_types.h"

namespace tandem::api {

struct http_server_config {
  std::string host = "127.0.0.1";
  uint16_t port = 8080;  // 0: an ephemeral port (port() says which)
  int threads = 2;
  uint64_t max_body_bytes = 8ull << 20;
  int max_connections = 256;
  std::chrono::milliseconds idle_timeout{60'000};      // a kept-alive connection with no request; a request's whole read
  std::chrono::milliseconds write_timeout{30'000};     // one write to a client that does not read
  std::chrono::milliseconds request_timeout{600'000};  // a generation's whole life
  // Called with a request's headers (the body not read yet): a response refuses it then,
  // without reading or buffering its body (authentication). Empty: every request is read.
  std::function<std::optional<http_response>(const http_request&)> admit;
};

// "HOST:PORT" (IPv6 as "[::1]:8080") into host and port; throws std::invalid_argument naming
// the text.
void parse_listen(const std::string& text, std::string* host, uint16_t* port);

class http_server {
 public:
  // Binds and starts serving. Throws std::runtime_error naming the address when it cannot bind.
  http_server(const http_server_config& config, route_handler handler);
  ~http_server();  // stop() with no grace
  http_server(const http_server&) = delete;
  http_server& operator=(const http_server&) = delete;

  uint16_t port() const { return port_; }
  // Stops accepting; generations in flight may finish until `grace` has passed, then they are
  // cancelled and every connection closes. Returns once the threads have ended. Idempotent.
  void stop(std::chrono::milliseconds grace = std::chrono::milliseconds(0));
  int open_connections() const;

  struct impl;

 private:
  std::unique_ptr<impl> impl_;
  std::vector<std::thread> threads_;
  uint16_t port_ = 0;
  std::mutex stop_m_;
  bool stopped_ = false;
};

}  // namespace tandem::api
