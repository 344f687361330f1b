#include "api/router.h"

#include <algorithm>
#include <cctype>

#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "api/log.h"
#include "api/api_error.h"
#include "api/routes.h"

namespace tandem::api {

namespace {

enum class access { open, inference, admin };

// Constant-time comparison: a key check must not leak how much of a guess was right.
bool same_key(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// The key of "Authorization: Bearer KEY" (the scheme name is case-insensitive); "" otherwise.
std::string bearer(const http_request& r) {
  constexpr std::string_view scheme = "bearer ";
  if (r.authorization.size() <= scheme.size()) return {};
  for (size_t i = 0; i < scheme.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(r.authorization[i])) != scheme[i]) return {};
  return r.authorization.substr(scheme.size());
}

bool any_key(const std::vector<std::string>& keys, const std::string& k) {
  bool ok = false;
  for (const auto& key : keys) ok |= same_key(key, k);
  return ok;
}

void authorize(const server_context& ctx, const http_request& r, access a) {
  if (a == access::open) return;
  const auto& cfg = ctx.config;
  const std::string key = bearer(r);
  if (a == access::admin) {
    if (cfg.admin_keys.empty()) {
      if (!r.loopback) throw api_error(403, "permission_error", "admin routes answer only on loopback when no admin keys are configured");
      return;
    }
    if (key.empty()) throw api_error(401, "authentication_error", "admin routes need an admin key: Authorization: Bearer KEY");
    if (!any_key(cfg.admin_keys, key)) throw api_error(403, "permission_error", "this key is not an admin key");
    return;
  }
  if (cfg.api_keys.empty()) return;
  if (key.empty()) throw api_error(401, "authentication_error", "you didn't provide an API key: Authorization: Bearer KEY", {}, "invalid_api_key");
  // An admin key may do what an inference key may.
  if (!any_key(cfg.api_keys, key) && !any_key(cfg.admin_keys, key))
    throw api_error(401, "authentication_error", "incorrect API key provided", {}, "invalid_api_key");
}

bool is_ollama(const std::string& path) { return path.rfind("/api/", 0) == 0; }

// The host part of a Host header or an Origin ("http://localhost:8080" -> "localhost").
std::string host_name(std::string_view v) {
  if (const auto scheme = v.find("://"); scheme != std::string_view::npos) v.remove_prefix(scheme + 3);
  if (!v.empty() && v.front() == '[') {
    const auto close = v.find(']');
    return std::string(v.substr(0, close == std::string_view::npos ? v.size() : close + 1));
  }
  return std::string(v.substr(0, v.find_first_of(":/")));
}

bool loopback_name(const std::string& h) {
  std::string l;
  for (const char c : h) l += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return l == "localhost" || l == "[::1]" || l == "::1" || l.rfind("127.", 0) == 0;
}

// A web page open in a local browser must not drive a server on loopback: refuse requests a
// browser marks as coming from another site (Origin), and, on a loopback server, Host names
// that are not loopback (DNS rebinding: a hostile name resolving to 127.0.0.1).
void refuse_browser_forgery(const http_request& r) {
  if (!r.origin.empty() && r.origin != "null" && r.server_on_loopback && !loopback_name(host_name(r.origin)))
    throw api_error(403, "permission_error", "cross-origin requests from " + r.origin + " are refused");
  if (r.server_on_loopback && !r.host.empty() && !loopback_name(host_name(r.host)))
    throw api_error(403, "permission_error", "Host '" + r.host + "' is not a loopback name; this server answers on loopback only");
}

std::vector<std::string> split_path(const std::string& p) {
  std::vector<std::string> parts;
  size_t i = 0;
  while (i < p.size()) {
    while (i < p.size() && p[i] == '/') ++i;
    const size_t j = p.find('/', i);
    if (i < p.size()) parts.push_back(p.substr(i, j == std::string::npos ? std::string::npos : j - i));
    if (j == std::string::npos) break;
    i = j;
  }
  return parts;
}

access access_of(const std::string& path) {
  if (path == "/health" || path == "/v1/health" || path == "/") return access::open;
  if (path.rfind("/admin/", 0) == 0) return access::admin;
  return access::inference;
}

using plain_handler = route_result (*)(server_context&, const http_request&);
struct fixed_route {
  std::string_view path;
  std::string_view method;  // GET routes answer HEAD too
  plain_handler handle;
};

// Paths without parameters; aliases without /v1 as llama.cpp's server has them.
constexpr fixed_route k_routes[] = {
    {"/health", "GET", handle_health},
    {"/v1/health", "GET", handle_health},
    {"/metrics", "GET", handle_metrics},
    {"/v1/models", "GET", handle_openai_models},
    {"/models", "GET", handle_openai_models},
    {"/v1/completions", "POST", handle_completions},
    {"/completions", "POST", handle_completions},
    {"/v1/chat/completions", "POST", handle_chat_completions},
    {"/chat/completions", "POST", handle_chat_completions},
    {"/infill", "POST", handle_infill},
    {"/completion", "POST", handle_llama_completion},
    {"/apply-template", "POST", handle_apply_template},
    {"/api/generate", "POST", handle_ollama_generate},
    {"/api/chat", "POST", handle_ollama_chat},
    {"/api/tags", "GET", handle_ollama_tags},
    {"/api/ps", "GET", handle_ollama_ps},
    {"/api/version", "GET", handle_ollama_version},
    {"/api/show", "POST", handle_ollama_show},
    {"/admin/models", "GET", handle_admin_models},
};

void require_method(const http_request& r, std::string_view method) {
  if (r.method == method || (method == "GET" && r.method == "HEAD")) return;
  throw api_error(405, "invalid_request_error", r.method + " is not allowed on " + r.path + "; use " + std::string(method));
}

// Origin and keys, where the server's admission hook has not checked them on the headers.
void admit(server_context& ctx, const http_request& r) {
  refuse_browser_forgery(r);
  authorize(ctx, r, access_of(r.path));
}

route_result dispatch(server_context& ctx, const http_request& r) {
  if (!r.admitted) admit(ctx, r);
  const auto& p = r.path;
  if (p == "/" && (r.method == "GET" || r.method == "HEAD")) {
    http_response res;
    res.content_type = "text/plain";
    res.body = "tandem is running";  // Ollama clients probe GET / for a server
    return res;
  }
  for (const auto& route : k_routes)
    if (p == route.path) {
      require_method(r, route.method);
      return route.handle(ctx, r);
    }
  // Routes with parameters: /v1/models/{id}, /admin/models/{name}[/{action}].
  if (p.rfind("/v1/models/", 0) == 0) {
    require_method(r, "GET");
    return handle_openai_model(ctx, r, p.substr(11));
  }
  if (const auto parts = split_path(p); parts.size() >= 3 && parts[0] == "admin" && parts[1] == "models") {
    if (parts.size() == 3) {
      require_method(r, "PATCH");
      return handle_admin_patch(ctx, r, parts[2]);
    }
    if (parts.size() == 4) {
      require_method(r, "POST");
      return handle_admin_action(ctx, r, parts[2], parts[3]);
    }
  }
  throw api_error(404, "invalid_request_error", "no route " + r.method + " " + p, {}, "unknown_url");
}

}  // namespace

http_response error_response(const std::string& path, int status, const std::string& type, const std::string& message, const std::string& param,
                             const std::string& code, int retry_after_s) {
  http_response res;
  res.status = status;
  if (is_ollama(path)) {
    res.body = nlohmann::json{{"error", message}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  } else {
    nlohmann::json e{{"message", message}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
    if (!param.empty()) e["param"] = param;
    if (!code.empty())
      e["code"] = code;
    else
      e["code"] = status;
    // Messages may quote request text (a path, a model name) that is not valid UTF-8.
    res.body = nlohmann::json{{"error", e}}.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  }
  if (retry_after_s > 0) res.headers.emplace_back("Retry-After", std::to_string(retry_after_s));
  if (status == 401) res.headers.emplace_back("WWW-Authenticate", "Bearer");
  return res;
}

std::function<std::optional<http_response>(const http_request&)> make_admission(server_context& ctx) {
  return [&ctx](const http_request& r) -> std::optional<http_response> {
    try {
      admit(ctx, r);
      return std::nullopt;
    } catch (const api_error& e) {
      return error_response(r.path, e.status, e.type, e.what(), e.param, e.code, e.retry_after_s);
    }
  };
}

route_handler make_router(server_context& ctx) {
  return [&ctx](const http_request& r) -> route_result {
    try {
      return dispatch(ctx, r);
    } catch (const api_error& e) {
      if (e.status >= 500) api::logger().warn("http: {} {}: {} {}", r.method, r.path, e.status, e.what());
      return error_response(r.path, e.status, e.type, e.what(), e.param, e.code, e.retry_after_s);
    } catch (const std::exception& e) {
      api::logger().error("http: {} {}: {}", r.method, r.path, e.what());
      return error_response(r.path, 500, "server_error", std::string("internal error: ") + e.what());
    }
  };
}

}  // namespace tandem::api
