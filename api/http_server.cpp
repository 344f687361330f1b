#include "api/http_server.h"

#include <charconv>
#include <deque>
#include <optional>
#include <stdexcept>
#include <unordered_map>

#include <boost/asio/dispatch.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>
#include "api/log.h"

namespace tandem::api {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = beast::http;
using tcp = net::ip::tcp;

void parse_listen(const std::string& text, std::string* host, uint16_t* port) {
  const auto colon = text.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == text.size())
    throw std::invalid_argument("listen address '" + text + "': expected HOST:PORT, e.g. 127.0.0.1:8080");
  std::string h = text.substr(0, colon);
  if (h.size() >= 2 && h.front() == '[' && h.back() == ']') h = h.substr(1, h.size() - 2);
  const std::string p = text.substr(colon + 1);
  unsigned v = 0;
  const auto [end, ec] = std::from_chars(p.data(), p.data() + p.size(), v);
  if (ec != std::errc() || end != p.data() + p.size() || v > 65535)
    throw std::invalid_argument("listen address '" + text + "': the port must be a number from 0 to 65535");
  beast::error_code bec;
  net::ip::make_address(h, bec);
  if (bec && h != "localhost") throw std::invalid_argument("listen address '" + text + "': '" + h + "' is not an IP address");
  *host = h == "localhost" ? "127.0.0.1" : h;
  *port = static_cast<uint16_t>(v);
}

class session;

// Sessions hold a plain reference: the io_context is destroyed first (it is declared after
// everything sessions touch), and with it the handlers that own the sessions.
struct http_server::impl {
  http_server_config cfg;
  route_handler handler;
  std::atomic<bool> stopping{false};
  std::atomic<int> generations{0};  // in flight
  mutable std::mutex m;
  std::unordered_map<session*, std::weak_ptr<session>> sessions;
  net::io_context ioc;
  tcp::acceptor acceptor;  // after ioc: an I/O object goes before its context

  bool on_loopback = false;
  // On a strand: stop() closes it from another thread while an accept handler may re-arm it.
  impl(const http_server_config& c, route_handler h) : cfg(c), handler(std::move(h)), ioc(c.threads), acceptor(net::make_strand(ioc)) {}
  void accept();
};

namespace {

std::string chunk(std::string_view data) {
  char size[20];
  const auto r = std::to_chars(size, size + sizeof size, data.size(), 16);
  std::string out(size, r.ptr);
  out += "\r\n";
  out.append(data);
  out += "\r\n";
  return out;
}

bool is_loopback(const tcp::endpoint& e) {
  const auto a = e.address();
  if (a.is_v6() && a.to_v6().is_v4_mapped()) return net::ip::make_address_v4(net::ip::v4_mapped, a.to_v6()).is_loopback();
  return a.is_loopback();
}

}  // namespace

class session : public std::enable_shared_from_this<session> {
 public:
  session(http_server::impl& srv, tcp::socket s) : srv_(srv), stream_(std::move(s)), deadline_(stream_.get_executor()) {
    beast::error_code ec;
    const auto ep = stream_.socket().remote_endpoint(ec);
    loopback_ = !ec && is_loopback(ep);
  }
  ~session() {
    if (gen_) {
      gen_->handle->set_notify(nullptr);
      gen_->handle->cancel();
      --srv_.generations;
    }
    std::lock_guard lock(srv_.m);
    srv_.sessions.erase(this);
  }

  void start() {
    net::dispatch(stream_.get_executor(), [self = shared_from_this()] { self->read_request(); });
  }

  // From stop(): cancel what runs and close (on the strand).
  void shut(bool cancel_generation) {
    net::post(stream_.get_executor(), [self = shared_from_this(), cancel_generation] {
      self->keep_alive_ = false;
      if (self->gen_) {
        if (cancel_generation) self->gen_->handle->cancel();
        return;  // the generation's end closes the connection
      }
      // A response (or a stream's last chunk) being written closes the connection once it is out.
      if ((self->responding_ || self->writing_) && !cancel_generation) return;
      self->close();
    });
  }

 private:
  void read_request() {
    if (closed_) return;
    if (srv_.stopping) return close();
    parser_.emplace();
    parser_->body_limit(srv_.cfg.max_body_bytes);
    parser_->header_limit(64 * 1024);
    stream_.expires_after(srv_.cfg.idle_timeout);
    // Headers first: a request the admission check refuses (no key, a forged origin) is
    // answered without its body ever being read or buffered.
    http::async_read_header(stream_, buf_, *parser_, [self = shared_from_this()](beast::error_code ec, size_t) { self->on_header(ec); });
  }

  // True (after answering) when the read failed; closes quietly when the peer simply left.
  bool read_failed(beast::error_code ec) {
    if (!ec) return false;
    if (ec == http::error::end_of_stream || ec == net::error::operation_aborted || ec == beast::error::timeout ||
        ec == net::error::connection_reset || ec == net::error::eof) {
      close();
      return true;
    }
    keep_alive_ = false;  // after an error the stream's framing is lost
    if (ec == http::error::body_limit)
      send(error(413, "the request body is larger than the server's limit of " + std::to_string(srv_.cfg.max_body_bytes) + " bytes"));
    else if (ec == http::error::header_limit)
      send(error(431, "the request headers are too large"));
    else
      send(error(400, std::string("malformed HTTP request: ") + ec.message()));
    return true;
  }

  http_request request_of(http::request<http::string_body>& req) const {
    http_request r;
    r.method = std::string(req.method_string());
    const std::string_view target = req.target();
    const auto q = target.find('?');
    r.path = std::string(target.substr(0, q));
    if (q != std::string_view::npos) r.query = std::string(target.substr(q + 1));
    r.authorization = std::string(req[http::field::authorization]);
    r.content_type = std::string(req[http::field::content_type]);
    r.host = std::string(req[http::field::host]);
    r.origin = std::string(req[http::field::origin]);
    r.loopback = loopback_;
    r.server_on_loopback = srv_.on_loopback;
    return r;
  }

  void on_header(beast::error_code ec) {
    if (read_failed(ec)) return;
    auto& req = parser_->get();
    head_ = req.method() == http::verb::head;
    if (srv_.cfg.admit) {
      std::optional<http_response> refused;
      try {
        refused = srv_.cfg.admit(request_of(req));
      } catch (const std::exception& e) {
        api::logger().error("http: admission: {}", e.what());
        refused = error(500, "internal error");
      }
      if (refused) {
        keep_alive_ = false;  // the body (if any) is left unread: the connection cannot go on
        return send(std::move(*refused));
      }
    }
    if (parser_->is_done()) return on_read({});
    http::async_read(stream_, buf_, *parser_, [self = shared_from_this()](beast::error_code e, size_t) { self->on_read(e); });
  }

  void on_read(beast::error_code ec) {
    if (read_failed(ec)) return;
    auto& req = parser_->get();
    http_request r = request_of(req);
    r.admitted = static_cast<bool>(srv_.cfg.admit);  // (a refused one never gets here)
    r.body = std::move(req.body());
    keep_alive_ = req.keep_alive() && !srv_.stopping;
    route_result res;
    try {
      res = srv_.handler(r);
    } catch (const std::exception& e) {
      api::logger().error("http: {} {}: {}", r.method, r.path, e.what());
      res = error(500, "internal error");
    }
    if (auto* resp = std::get_if<http_response>(&res)) return send(std::move(*resp));
    start_generation(std::move(std::get<generation_stream>(res)));
  }

  static http_response error(int status, std::string message) {
    http_response r;
    r.status = status;
    r.body = nlohmann::json{{"error",
                             {{"message", std::move(message)},
                              {"type", status >= 500 ? "server_error" : "invalid_request_error"},
                              {"param", nullptr},
                              {"code", status}}}}
                 .dump();
    return r;
  }

  void send(http_response r) {
    auto res = std::make_shared<http::response<http::string_body>>(static_cast<http::status>(r.status), 11);
    res->set(http::field::server, "tandem");
    res->set(http::field::content_type, r.content_type);
    for (const auto& [k, v] : r.headers) res->set(k, v);
    res->keep_alive(keep_alive_);
    if (head_) {
      // HEAD: the headers a GET would get, without the body (Ollama's client probes with HEAD /).
      res->content_length(r.body.size());
    } else {
      res->body() = std::move(r.body);
      res->prepare_payload();
    }
    stream_.expires_after(srv_.cfg.write_timeout);
    responding_ = true;
    http::async_write(stream_, *res, [self = shared_from_this(), res](beast::error_code ec, size_t) {
      self->responding_ = false;
      if (ec || !self->keep_alive_) return self->close();
      self->next_request();
    });
  }

  // The next request on a kept-alive connection; a disconnect probe still reading is
  // cancelled first, and its bytes (a pipelined request) stay in buf_.
  void next_request() {
    if (probing_) {
      want_next_ = true;
      beast::error_code ec;
      stream_.socket().cancel(ec);
      return;
    }
    read_request();
  }

  void start_generation(generation_stream g) {
    gen_ = std::move(g);
    broken_ = false;
    ++srv_.generations;
    stream_.expires_never();
    deadline_.expires_after(srv_.cfg.request_timeout);
    deadline_.async_wait([w = weak_from_this()](beast::error_code ec) {
      if (auto s = w.lock(); s && !ec && s->gen_) s->gen_->handle->cancel();
    });
    probe();
    if (gen_->chunked) {
      auto head = std::make_shared<http::response<http::empty_body>>(static_cast<http::status>(gen_->status), 11);
      head->set(http::field::server, "tandem");
      head->set(http::field::content_type, gen_->content_type);
      head->set(http::field::cache_control, "no-cache");
      head->keep_alive(keep_alive_);
      head->chunked(true);
      auto sr = std::make_shared<http::response_serializer<http::empty_body>>(*head);
      writing_ = true;
      stream_.expires_after(srv_.cfg.write_timeout);
      http::async_write_header(stream_, *sr, [self = shared_from_this(), head, sr](beast::error_code ec, size_t) { self->on_written(ec); });
    }
    // The callback holds the session: after a disconnect no read or write may be pending, and
    // the session must live until the engine has ended the request. The handle drops the
    // callback when it finishes, which ends the cycle.
    gen_->handle->set_notify([s = shared_from_this()] { net::post(s->stream_.get_executor(), [s] { s->pump(); }); });
  }

  // Watches the socket while the generation runs: EOF or an error means the client left.
  void probe() {
    if (probing_ || client_gone_ || closed_ || buf_.size() > 64 * 1024) return;
    probing_ = true;
    stream_.async_read_some(buf_.prepare(4096), [self = shared_from_this()](beast::error_code ec, size_t n) {
      self->probing_ = false;
      if (!ec) {
        self->buf_.commit(n);
        if (self->gen_) return self->probe();
      } else if (!(ec == net::error::operation_aborted && self->want_next_)) {
        self->client_gone_ = true;
        self->keep_alive_ = false;
        if (self->gen_) self->gen_->handle->cancel();
      }
      if (self->want_next_) {
        self->want_next_ = false;
        if (self->client_gone_) return self->close();
        self->read_request();
      }
    });
  }

  void on_written(beast::error_code ec) {
    writing_ = false;
    if (ec) {
      client_gone_ = true;
      keep_alive_ = false;
      if (gen_) gen_->handle->cancel();
    }
    if (gen_) {
      stream_.expires_never();
      pump();
    } else if (ec || !keep_alive_) {
      close();
    } else {
      next_request();
    }
  }

  void pump() {
    if (!gen_ || writing_) return;
    auto& h = *gen_->handle;
    std::string out;
    runtime::piece p;
    auto take = [&] {
      while (h.next(&p, std::chrono::milliseconds(0))) {
        if (broken_) continue;
        try {
          out += gen_->on_piece(p);
        } catch (const std::exception& e) {
          // A route's formatter failed: what was sent cannot be completed consistently, so
          // the generation is cancelled and the connection closed once it has ended.
          api::logger().error("http: streaming a generation: {}", e.what());
          broken_ = true;
          client_gone_ = true;
          keep_alive_ = false;
          h.cancel();
        }
      }
    };
    take();
    if (h.finished() != runtime::finish_reason::none) {
      take();  // pushed just before the end
      return end_generation(std::move(out));
    }
    if (out.empty() || client_gone_ || !gen_->chunked) return;
    write_bytes(chunk(out));
  }

  void write_bytes(std::string bytes) {
    auto data = std::make_shared<std::string>(std::move(bytes));
    writing_ = true;
    stream_.expires_after(srv_.cfg.write_timeout);
    net::async_write(stream_, net::buffer(*data), [self = shared_from_this(), data](beast::error_code ec, size_t) { self->on_written(ec); });
  }

  void end_generation(std::string out) {
    auto g = std::move(*gen_);
    gen_.reset();
    --srv_.generations;
    deadline_.cancel();
    http_response last;
    try {
      last = g.on_end();
    } catch (const std::exception& e) {
      api::logger().error("http: ending a generation: {}", e.what());
      last = error(500, "internal error");
    }
    if (g.on_close) g.on_close(client_gone_);
    if (client_gone_) return close();
    if (g.chunked) {
      out += last.body;
      std::string bytes = out.empty() ? std::string() : chunk(out);
      bytes += "0\r\n\r\n";
      return write_bytes(std::move(bytes));  // on_written then reads the next request or closes
    }
    send(std::move(last));
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    deadline_.cancel();
    beast::error_code ec;
    stream_.socket().shutdown(tcp::socket::shutdown_send, ec);
    stream_.close();
  }

  http_server::impl& srv_;
  beast::tcp_stream stream_;
  beast::flat_buffer buf_;
  std::optional<http::request_parser<http::string_body>> parser_;
  net::steady_timer deadline_;
  std::optional<generation_stream> gen_;
  bool loopback_ = false;
  bool head_ = false;    // the request being answered is a HEAD
  bool broken_ = false;  // the generation's formatter threw: pieces are dropped until its end
  bool keep_alive_ = true;
  bool writing_ = false;
  bool responding_ = false;  // a whole response is being written
  bool probing_ = false;
  bool want_next_ = false;
  bool client_gone_ = false;
  bool closed_ = false;
};

void http_server::impl::accept() {
  acceptor.async_accept(net::make_strand(ioc), [self = this](beast::error_code ec, tcp::socket s) {
    if (ec) {
      if (!self->acceptor.is_open()) return;
      api::logger().warn("http: accept: {}", ec.message());
      return self->accept();
    }
    bool full = false;
    {
      std::lock_guard lock(self->m);
      full = static_cast<int>(self->sessions.size()) >= self->cfg.max_connections;
    }
    if (full) {
      // Answered here, briefly and synchronously: the socket's buffer takes this much.
      static const std::string busy = [] {
        const std::string body =
            R"({"error":{"message":"the server has too many open connections; retry later","type":"server_error","param":null,"code":503}})";
        return "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\nRetry-After: 1\r\nConnection: close\r\nContent-Length: " +
               std::to_string(body.size()) + "\r\n\r\n" + body;
      }();
      beast::error_code wec;
      net::write(s, net::buffer(busy), wec);
      s.shutdown(tcp::socket::shutdown_both, wec);
    } else {
      auto sess = std::make_shared<session>(*self, std::move(s));
      {
        std::lock_guard lock(self->m);
        self->sessions[sess.get()] = sess;
      }
      sess->start();
    }
    self->accept();
  });
}

http_server::http_server(const http_server_config& config, route_handler handler) : impl_(std::make_unique<impl>(config, std::move(handler))) {
  beast::error_code ec;
  const auto addr = net::ip::make_address(config.host, ec);
  if (ec) throw std::runtime_error("listen address '" + config.host + "': " + ec.message());
  const tcp::endpoint ep(addr, config.port);
  auto& a = impl_->acceptor;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(net::socket_base::max_listen_connections, ec);
  if (ec) throw std::runtime_error("cannot listen on " + config.host + ":" + std::to_string(config.port) + ": " + ec.message());
  port_ = a.local_endpoint().port();
  impl_->on_loopback = addr.is_loopback();
  impl_->accept();
  for (int i = 0; i < std::max(1, config.threads); ++i)
    threads_.emplace_back([this] {
      for (;;) {
        try {
          impl_->ioc.run();
          return;
        } catch (const std::exception& e) {
          // A handler threw past its own catch: log it, keep the thread serving.
          api::logger().error("http: {}", e.what());
        }
      }
    });
}

http_server::~http_server() { stop(); }

int http_server::open_connections() const {
  std::lock_guard lock(impl_->m);
  return static_cast<int>(impl_->sessions.size());
}

void http_server::stop(std::chrono::milliseconds grace) {
  std::lock_guard stop_lock(stop_m_);
  if (stopped_) return;
  stopped_ = true;
  impl_->stopping = true;
  net::post(impl_->acceptor.get_executor(), [i = impl_.get()] {
    beast::error_code ec;
    i->acceptor.close(ec);
  });
  auto live = [&] {
    std::vector<std::shared_ptr<session>> v;
    std::lock_guard lock(impl_->m);
    for (auto& [p, w] : impl_->sessions)
      if (auto s = w.lock()) v.push_back(std::move(s));
    return v;
  };
  // Generations may finish within the grace; idle connections close now.
  for (auto& s : live()) s->shut(false);
  const auto until = std::chrono::steady_clock::now() + grace;
  while (impl_->generations > 0 && std::chrono::steady_clock::now() < until) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  for (auto& s : live()) s->shut(true);
  // Cancelled generations end within an engine iteration; then nothing is left to run.
  const auto hard = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (open_connections() > 0 && std::chrono::steady_clock::now() < hard) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  impl_->ioc.stop();
  for (auto& t : threads_) t.join();
  threads_.clear();
}

}  // namespace tandem::api
