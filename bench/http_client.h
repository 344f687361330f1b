// A small blocking HTTP/1.1 client over POSIX sockets, for the HTTP load bench and the API
// tests: whole requests and replies (Content-Length or chunked), raw bytes for malformed
// requests, and reads that can stop half-way, as a client that disconnects does.
#pragma once

#include <chrono>
#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace tandem::bench {

struct http_reply {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-case
  std::string body;                            // de-chunked
};

using header_list = std::vector<std::pair<std::string, std::string>>;

class http_conn {
 public:
  // Connects to 127.0.0.1:port; throws std::runtime_error when it cannot.
  explicit http_conn(uint16_t port);
  ~http_conn();
  http_conn(const http_conn&) = delete;
  http_conn& operator=(const http_conn&) = delete;

  void close();
  void send_raw(const std::string& bytes);
  void send(const std::string& method, const std::string& path, const std::string& body = {}, const header_list& headers = {});
  // Reads until `needle` has arrived (raw bytes, chunk framing included) or the timeout.
  bool read_until(const std::string& needle, std::chrono::milliseconds timeout = std::chrono::seconds(60));
  // Waits for more bytes; false on EOF or timeout.
  bool read_more(std::chrono::milliseconds timeout) { return fill(std::chrono::steady_clock::now() + timeout); }
  // One whole reply; throws std::runtime_error on a timeout or a connection closed early.
  http_reply reply(std::chrono::milliseconds timeout = std::chrono::seconds(120));
  // True when the server has closed the connection (EOF) within the timeout.
  bool closed_by_server(std::chrono::milliseconds timeout);
  const std::string& raw() const { return raw_; }

 private:
  bool fill(std::chrono::steady_clock::time_point until);
  int fd_ = -1;
  std::string raw_;
  std::vector<bool> pending_head_;  // per request sent and not yet answered: was it a HEAD
  bool eof_ = false;
};

// One request on a fresh connection.
http_reply http_call(uint16_t port, const std::string& method, const std::string& path, const std::string& body = {},
                     const header_list& headers = {});

}  // namespace tandem::bench
