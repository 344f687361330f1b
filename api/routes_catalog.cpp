// The model listings: OpenAI's /v1/models (with tandem's residency per model) and Ollama's
// /api/tags, /api/ps, /api/show and /api/version.
#include <nlohmann/json.hpp>

#include "api/api_error.h"
#include "api/generation.h"
#include "api/json_body.h"
#include "api/model_details.h"
#include "api/model_state.h"
#include "api/routes.h"
#include "configs/duration.h"

namespace tandem::api {

using nlohmann::json;

namespace {

http_response json_response(const json& j) {
  http_response r;
  r.body = j.dump();
  return r;
}

json openai_model(server_context& ctx, const runtime::served_model& m, const memory::arbiter_snapshot& snap) {
  const auto res = residency_of(snap, m.name());
  const auto st = ctx.served.executor().stats(m.name());
  const auto* e = m.entry;
  return json{{"id", m.name()},
              {"object", "model"},
              {"created", std::chrono::duration_cast<std::chrono::seconds>(m.created.time_since_epoch()).count()},
              {"owned_by", "tandem"},
              {"root", e->file},
              {"max_model_len", e->context},
              {"status", {{"value", res.state}, {"ready", res.runnable}}},
              {"tandem",
               {{"aliases", e->aliases},
                {"role", configs::role_name(e->role)},
                {"priority", st.priority},
                {"pinned", st.pinned},
                {"state", res.state},
                {"ready", res.runnable},
                {"device_bytes", res.device_bytes},
                {"host_bytes", res.host_bytes},
                {"weight_bytes", res.weight_bytes},
                {"queued", st.queued},
                {"running", st.running}}}};
}

json ollama_details(const model_details& d) {
  return json{{"parent_model", ""},
              {"format", "gguf"},
              {"family", d.family},
              {"families", json::array({d.family})},
              {"parameter_size", d.parameter_size},
              {"quantization_level", d.quantization}};
}

// When an idle model's keep-alive runs out; far in the future for one kept for ever, as
// Ollama reports it.
std::string expires_at(const runtime::model_stats& st) {
  if (st.pinned || st.keep_alive.forever) return "2318-08-30T00:00:00Z";
  const auto idle_for = std::chrono::steady_clock::now() - st.last_used;
  const auto left = std::chrono::duration_cast<std::chrono::system_clock::duration>(st.keep_alive.after - idle_for);
  return rfc3339(std::chrono::system_clock::now() + left);
}

}  // namespace

route_result handle_openai_models(server_context& ctx, const http_request&) {
  const auto snap = ctx.served.arbiter().snapshot();
  json data = json::array();
  for (const auto& m : ctx.served.models()) data.push_back(openai_model(ctx, *m, snap));
  return json_response({{"object", "list"}, {"data", data}});
}

route_result handle_openai_model(server_context& ctx, const http_request&, const std::string& id) {
  const auto& m = resolve_model(ctx, id);
  return json_response(openai_model(ctx, m, ctx.served.arbiter().snapshot()));
}

route_result handle_ollama_tags(server_context& ctx, const http_request&) {
  json models = json::array();
  for (const auto& m : ctx.served.models()) {
    const auto d = details_of(*m);
    models.push_back({{"name", m->name()},
                      {"model", m->name()},
                      {"modified_at", rfc3339(m->created)},
                      {"size", m->file_bytes},
                      {"digest", d.digest},
                      {"details", ollama_details(d)}});
  }
  return json_response({{"models", models}});
}

route_result handle_ollama_ps(server_context& ctx, const http_request&) {
  const auto snap = ctx.served.arbiter().snapshot();
  json models = json::array();
  for (const auto& m : ctx.served.models()) {
    const auto res = residency_of(snap, m->name());
    if (res.device_bytes == 0 && res.stream_slots == 0) continue;  // loaded means on the device, as in Ollama
    const auto d = details_of(*m);
    const auto st = ctx.served.executor().stats(m->name());
    models.push_back({{"name", m->name()},
                      {"model", m->name()},
                      {"size", res.weight_bytes},
                      {"digest", d.digest},
                      {"details", ollama_details(d)},
                      {"expires_at", expires_at(st)},
                      {"size_vram", res.device_bytes},
                      {"context_length", m->entry->context}});
  }
  return json_response({{"models", models}});
}

route_result handle_ollama_version(server_context&, const http_request&) { return json_response({{"version", "0.1.0"}}); }

route_result handle_ollama_show(server_context& ctx, const http_request& r) {
  const json body = parse_json_object(r);
  const json* name = body.contains("model") ? &body["model"] : body.contains("name") ? &body["name"] : nullptr;
  if (!name || !name->is_string()) throw bad_request("model is required", "model");
  const auto& m = resolve_model(ctx, name->get<std::string>());
  const auto d = details_of(m);
  const auto& c = m.model->config();
  json caps = json::array({"completion"});
  if (d.fim) caps.push_back("insert");
  // Continue reads the template to learn whether a model takes a suffix (FIM).
  const std::string tmpl = d.fim ? "{{ .Prompt }}{{ .Suffix }}" : "{{ .Prompt }}";
  return json_response({{"modelfile", ""},
                        {"parameters", ""},
                        {"template", tmpl},
                        {"details", ollama_details(d)},
                        {"model_info",
                         {{"general.architecture", d.family},
                          {"general.parameter_count", d.parameters},
                          {d.family + ".context_length", c.n_ctx_train},
                          {d.family + ".embedding_length", c.n_embd},
                          {d.family + ".block_count", c.n_layer}}},
                        {"capabilities", caps},
                        {"modified_at", rfc3339(m.created)}});
}

}  // namespace tandem::api
