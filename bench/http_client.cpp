#include "bench/http_client.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cctype>
#include <stdexcept>

namespace tandem::bench {

http_conn::http_conn(uint16_t port) {
  fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd_ < 0) throw std::runtime_error("socket() failed");
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd_);
    fd_ = -1;
    throw std::runtime_error("connect to 127.0.0.1:" + std::to_string(port) + " failed");
  }
}

http_conn::~http_conn() { close(); }

void http_conn::close() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

void http_conn::send_raw(const std::string& bytes) {
  size_t off = 0;
  while (off < bytes.size()) {
    const ssize_t n = ::send(fd_, bytes.data() + off, bytes.size() - off, MSG_NOSIGNAL);
    if (n <= 0) throw std::runtime_error("send failed");
    off += static_cast<size_t>(n);
  }
}

void http_conn::send(const std::string& method, const std::string& path, const std::string& body, const header_list& headers) {
  std::string req = method + " " + path + " HTTP/1.1\r\n";
  bool has_type = false, has_host = false;
  for (const auto& [k, v] : headers) {
    req += k + ": " + v + "\r\n";
    has_type |= k == "Content-Type";
    has_host |= k == "Host";
  }
  if (!has_host) req += "Host: 127.0.0.1\r\n";
  pending_head_.push_back(method == "HEAD");
  if (!body.empty() && !has_type) req += "Content-Type: application/json\r\n";
  if (!body.empty() || method == "POST" || method == "PATCH") req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  req += "\r\n" + body;
  send_raw(req);
}

bool http_conn::read_until(const std::string& needle, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  while (raw_.find(needle) == std::string::npos)
    if (!fill(until)) return false;
  return true;
}

http_reply http_conn::reply(std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  size_t head_end;
  while ((head_end = raw_.find("\r\n\r\n")) == std::string::npos)
    if (!fill(until)) throw std::runtime_error("no reply head (got " + std::to_string(raw_.size()) + " bytes)");
  http_reply r;
  const std::string head = raw_.substr(0, head_end);
  size_t pos = head.find("\r\n");
  const std::string status_line = head.substr(0, pos);
  r.status = std::stoi(status_line.substr(9, 3));
  while (pos != std::string::npos && pos < head.size()) {
    const size_t next = head.find("\r\n", pos + 2);
    const std::string line = head.substr(pos + 2, next == std::string::npos ? std::string::npos : next - pos - 2);
    const auto colon = line.find(':');
    if (colon != std::string::npos) {
      std::string k = line.substr(0, colon);
      for (auto& c : k) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      std::string v = line.substr(colon + 1);
      while (!v.empty() && v.front() == ' ') v.erase(v.begin());
      r.headers[k] = v;
    }
    pos = next;
  }
  size_t at = head_end + 4;
  // A reply to HEAD has the headers of a GET and no body.
  const bool head_only = !pending_head_.empty() && pending_head_.front();
  if (!pending_head_.empty()) pending_head_.erase(pending_head_.begin());
  if (head_only) {
    // nothing to read
  } else if (r.headers["transfer-encoding"] == "chunked") {
    for (;;) {
      size_t eol;
      while ((eol = raw_.find("\r\n", at)) == std::string::npos)
        if (!fill(until)) throw std::runtime_error("chunked body cut short");
      const size_t n = std::stoul(raw_.substr(at, eol - at), nullptr, 16);
      while (raw_.size() < eol + 2 + n + 2)
        if (!fill(until)) throw std::runtime_error("chunk cut short");
      r.body += raw_.substr(eol + 2, n);
      at = eol + 2 + n + 2;
      if (n == 0) break;
    }
  } else {
    const size_t n = r.headers.count("content-length") ? std::stoul(r.headers["content-length"]) : 0;
    while (raw_.size() < at + n)
      if (!fill(until)) throw std::runtime_error("body cut short");
    r.body = raw_.substr(at, n);
    at += n;
  }
  raw_.erase(0, at);
  return r;
}
bool http_conn::closed_by_server(std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  for (;;) {
    const size_t before = raw_.size();
    if (!fill(until)) return eof_;
    if (raw_.size() == before) return eof_;
  }
}
bool http_conn::fill(std::chrono::steady_clock::time_point until) {
  if (eof_) return false;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(until - std::chrono::steady_clock::now()).count();
  if (left <= 0) return false;
  pollfd p{fd_, POLLIN, 0};
  if (::poll(&p, 1, static_cast<int>(left)) <= 0) return false;
  char buf[16384];
  const ssize_t n = ::recv(fd_, buf, sizeof buf, 0);
  if (n <= 0) {
    eof_ = true;
    return false;
  }
  raw_.append(buf, static_cast<size_t>(n));
  return true;
}

http_reply http_call(uint16_t port, const std::string& method, const std::string& path, const std::string& body, const header_list& headers) {
  http_conn c(port);
  c.send(method, path, body, headers);
  return c.reply();
}

}  // namespace tandem::bench
