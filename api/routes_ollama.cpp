// Ollama's POST /api/generate (with `suffix` for FIM, `raw`, load and unload requests) and
// POST /api/chat, streamed as NDJSON (one JSON object per line) or answered whole; a
// request's keep_alive becomes the model's (0 unloads it once idle, negative keeps it).
#include <memory>

#include <nlohmann/json.hpp>

#include "api/api_error.h"
#include "api/generation.h"
#include "api/json_body.h"
#include "api/ollama_request.h"
#include "api/routes.h"
#include "models/fim.h"

namespace tandem::api {

using nlohmann::json;

namespace {

configs::keep_alive_setting setting_of(const keep_alive& k) {
  configs::keep_alive_setting s;
  s.forever = k.forever;
  s.after = std::chrono::duration_cast<configs::duration>(k.after);
  return s;
}

int64_t ns(double ms) { return static_cast<int64_t>(ms * 1e6); }

struct ollama_state {
  bool chat = false, stream = true;
  std::string model, text;
  request_clock clock;
  ollama_state(server_context& ctx, bool is_chat, std::string m, int64_t prompt_tokens, request_clock::clock::time_point arrived)
      : chat(is_chat), model(std::move(m)), clock(ctx, model, is_chat ? "ollama_chat" : "ollama_generate", prompt_tokens, arrived) {}

  json head() const { return {{"model", model}, {"created_at", rfc3339_now()}}; }
  json piece(const std::string& t) const {
    json j = head();
    if (chat)
      j["message"] = {{"role", "assistant"}, {"content", t}};
    else
      j["response"] = t;
    j["done"] = false;
    return j;
  }
  json last(runtime::finish_reason why, const std::string& t) const {
    json j = piece(t);
    j["done"] = true;
    j["done_reason"] = why == runtime::finish_reason::length || why == runtime::finish_reason::context ? "length" : "stop";
    if (!chat) j["context"] = json::array();
    j["total_duration"] = ns(clock.total_ms());
    j["load_duration"] = 0;
    j["prompt_eval_count"] = clock.prompt_tokens();
    j["prompt_eval_duration"] = ns(clock.prompt_ms());
    j["eval_count"] = clock.generated();
    j["eval_duration"] = ns(clock.predict_ms());
    return j;
  }
};

// A request without anything to generate: load the model (keep_alive 0: unload it).
http_response load_or_unload(server_context& ctx, const runtime::served_model& m, const ollama_request& req, bool chat) {
  runtime::model_control c;
  const bool unload = req.keep_alive && !req.keep_alive->forever && req.keep_alive->after.count() == 0;
  if (req.keep_alive && !unload) c.keep_alive = setting_of(*req.keep_alive);
  if (unload) {
    if (ctx.served.executor().stats(m.name()).pinned)
      throw api_error(409, "invalid_request_error", "model '" + m.name() + "' is pinned; unpin it before unloading");
    c.evict = true;
  } else {
    c.load = true;
  }
  ctx.served.executor().control(m.name(), c);
  json j{{"model", m.name()}, {"created_at", rfc3339_now()}, {"done", true}, {"done_reason", unload ? "unload" : "load"}};
  if (chat)
    j["message"] = {{"role", "assistant"}, {"content", ""}};
  else
    j["response"] = "";
  http_response r;
  r.body = j.dump();
  return r;
}

route_result stream_of(server_context& ctx, const runtime::served_model& m, const ollama_request& req, std::vector<int32_t> prompt, bool chat,
                       const http_request& r) {
  auto params = req.gen.params;
  params.constraint = compile_constraint(req.gen.constraint, r.body);
  auto sub = submit_generation(ctx, m, std::move(prompt), std::move(params));
  // Only once the request is accepted: keep_alive 0 on a generating request unloads the
  // model when it is idle again.
  if (req.keep_alive) {
    runtime::model_control c;
    c.keep_alive = setting_of(*req.keep_alive);
    ctx.served.executor().control(m.name(), c);
  }
  auto st = std::make_shared<ollama_state>(ctx, chat, m.name(), sub.prompt_tokens, r.received_at);
  st->stream = req.gen.stream;
  generation_stream g;
  g.handle = sub.handle;
  g.chunked = st->stream;
  g.content_type = st->stream ? "application/x-ndjson" : "application/json";
  g.on_piece = [st](const runtime::piece& p) -> std::string {
    if (p.token >= 0) st->clock.token(p.at);
    if (!st->stream) {
      st->text += p.text;
      return {};
    }
    return p.text.empty() ? std::string() : st->piece(p.text).dump() + "\n";
  };
  g.on_end = [st, h = sub.handle]() -> http_response {
    http_response r;
    const auto why = h->finished();
    if (why == runtime::finish_reason::error) {
      r.body = json{{"error", h->error()}}.dump() + (st->stream ? "\n" : "");
      if (!st->stream) r.status = 500;
      return r;
    }
    r.body = st->last(why, st->stream ? "" : st->text).dump() + (st->stream ? "\n" : "");
    return r;
  };
  g.on_close = [st, h = sub.handle](bool gone) { st->clock.finish(h->finished(), gone); };
  return g;
}

}  // namespace

route_result handle_ollama_generate(server_context& ctx, const http_request& r) {
  const auto req = parse_ollama_generate(parse_json_object(r), {ctx.config.limits.max_tokens});
  const auto& m = resolve_model(ctx, req.gen.model);
  if (req.load_only) return load_or_unload(ctx, m, req, false);
  std::vector<int32_t> prompt;
  const std::string text = req.gen.prompt.value_or("");
  if (req.gen.suffix) {
    const auto fim = models::find_fim_tokens(*m.tokenizer);
    if (!fim.usable()) throw bad_request("model '" + m.name() + "' does not support insert (it has no fill-in-the-middle tokens)", "suffix");
    models::infill_input in;
    in.prefix = text;
    in.suffix = *req.gen.suffix;
    prompt = models::build_infill_prompt(*m.tokenizer, fim, in, m.entry->context, m.entry->context, req.gen.params.max_tokens);
  } else if (req.raw || (!m.chat.program && m.chat.kind == models::chat_template_kind::plain)) {
    // A model without a chat template completes the prompt as written (Ollama's template for
    // such models is just the prompt).
    prompt = tokenize_prompt(m, req.system && !req.raw ? *req.system + "\n\n" + text : text);
  } else {
    std::vector<models::chat_message> msgs;
    if (req.system) msgs.push_back({"system", *req.system});
    msgs.push_back({"user", text});
    prompt = tokenize_chat(m, msgs);
  }
  return stream_of(ctx, m, req, std::move(prompt), false, r);
}

route_result handle_ollama_chat(server_context& ctx, const http_request& r) {
  const auto req = parse_ollama_chat(parse_json_object(r), {ctx.config.limits.max_tokens});
  const auto& m = resolve_model(ctx, req.gen.model);
  if (req.load_only) return load_or_unload(ctx, m, req, true);
  return stream_of(ctx, m, req, tokenize_chat(m, req.gen.messages), true, r);
}

}  // namespace tandem::api
