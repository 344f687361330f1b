// The handlers behind the route table (router.cpp). Each parses and validates its request,
// throws api_error for what it refuses, and returns a response or a generation to stream.
#pragma once

#include <string>

#include "api/http_types.h"
#include "api/server_context.h"

namespace tandem::api {

// GET /health, GET /metrics (routes_status.cpp)
route_result handle_health(server_context& ctx, const http_request& r);
route_result handle_metrics(server_context& ctx, const http_request& r);

// GET /v1/models, GET /v1/models/{id} (routes_catalog.cpp); POST /v1/completions,
// POST /v1/chat/completions (routes_openai.cpp)
route_result handle_openai_models(server_context& ctx, const http_request& r);
route_result handle_openai_model(server_context& ctx, const http_request& r, const std::string& id);
route_result handle_completions(server_context& ctx, const http_request& r);
route_result handle_chat_completions(server_context& ctx, const http_request& r);

// POST /infill (routes_infill.cpp)
route_result handle_infill(server_context& ctx, const http_request& r);
route_result handle_llama_completion(server_context& ctx, const http_request& r);
route_result handle_apply_template(server_context& ctx, const http_request& r);

// POST /api/generate, POST /api/chat (routes_ollama.cpp); GET /api/tags, GET /api/ps,
// GET /api/version, POST /api/show (routes_catalog.cpp)
route_result handle_ollama_generate(server_context& ctx, const http_request& r);
route_result handle_ollama_chat(server_context& ctx, const http_request& r);
route_result handle_ollama_tags(server_context& ctx, const http_request& r);
route_result handle_ollama_ps(server_context& ctx, const http_request& r);
route_result handle_ollama_version(server_context& ctx, const http_request& r);
route_result handle_ollama_show(server_context& ctx, const http_request& r);

// GET /admin/models, POST /admin/models/{name}/{load|evict|pin|unpin},
// PATCH /admin/models/{name} (routes_admin.cpp)
route_result handle_admin_models(server_context& ctx, const http_request& r);
route_result handle_admin_action(server_context& ctx, const http_request& r, const std::string& name, const std::string& action);
route_result handle_admin_patch(server_context& ctx, const http_request& r, const std::string& name);

}  // namespace tandem::api
