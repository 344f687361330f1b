// POST /v1/completions and POST /v1/chat/completions: OpenAI's shapes, streamed as SSE
// (`data: {...}` events, a usage chunk when asked, `data: [DONE]`) or answered whole.
#include <cmath>
#include <memory>

#include <nlohmann/json.hpp>

#include "api/api_error.h"
#include "api/generation.h"
#include "api/json_body.h"
#include "api/openai_request.h"
#include "api/routes.h"
#include "models/fim.h"
#include "models/unicode.h"

namespace tandem::api {

using nlohmann::json;

namespace {

enum class dialect { completion, chat };

struct openai_state {
  dialect kind;
  std::string id, model;
  int64_t created = unix_seconds();
  bool stream = false, include_usage = false, sent_role = false;
  bool predicted = false;  // the request gave a prediction: its tokens' fate goes in the usage
  std::shared_ptr<runtime::request_handle> handle;
  std::string text;  // the whole answer (not streamed)
  // logprobs asked for: the tokenizer spells the tokens; the whole answer's entries (chat:
  // content; completions: the four parallel lists) and the text offset of the next token.
  const models::tokenizer* tokenizer = nullptr;
  bool logprobs = false;
  json lp = json::object();
  size_t text_offset = 0;
  request_clock clock;
  openai_state(server_context& ctx, dialect k, std::string m, int64_t prompt_tokens, request_clock::clock::time_point arrived)
      : kind(k),
        id(make_id(k == dialect::chat ? "chatcmpl-" : "cmpl-")),
        model(std::move(m)),
        clock(ctx, model, k == dialect::chat ? "chat" : "completions", prompt_tokens, arrived) {}

  json usage() const {
    json u{{"prompt_tokens", clock.prompt_tokens()},
           {"completion_tokens", clock.generated()},
           {"total_tokens", clock.prompt_tokens() + clock.generated()}};
    // As OpenAI reports predicted outputs: predicted tokens that were kept, and those that
    // were proposed and not (they cost a row of a pass each).
    if (predicted && handle) {
      const auto sp = handle->speculation();
      u["completion_tokens_details"] = {
          {"reasoning_tokens", 0}, {"accepted_prediction_tokens", sp.accepted}, {"rejected_prediction_tokens", sp.proposed - sp.accepted}};
    }
    return u;
  }
  json chunk(json choice) const {
    json c{{"id", id},
           {"object", kind == dialect::chat ? "chat.completion.chunk" : "text_completion"},
           {"created", created},
           {"model", model},
           {"choices", json::array({std::move(choice)})}};
    if (include_usage) c["usage"] = nullptr;  // OpenAI: null on every chunk but the last
    return c;
  }
  json delta_choice(json delta, json finish) const {
    if (kind == dialect::chat) return {{"index", 0}, {"delta", std::move(delta)}, {"finish_reason", std::move(finish)}};
    return {{"index", 0}, {"text", delta.value("content", "")}, {"logprobs", nullptr}, {"finish_reason", std::move(finish)}};
  }
  static std::string event(const json& j) { return "data: " + j.dump() + "\n\n"; }

  // A token as OpenAI spells it: its text (invalid UTF-8 of a partial character replaced) and
  // its bytes.
  std::pair<std::string, json> spell(int32_t id) const {
    const std::string raw = tokenizer->token_to_piece(id, true);
    json bytes = json::array();
    for (const unsigned char c : raw) bytes.push_back(static_cast<int>(c));
    return {models::utf8_sanitize(raw), std::move(bytes)};
  }
  // One token's logprobs in the dialect's shape, appended to `into` (an empty object starts it).
  void add_logprob(json& into, int32_t id, const runtime::token_logprob& t) {
    auto [text, bytes] = spell(id);
    const double lp_value = std::isfinite(t.logprob) ? t.logprob : -9999.0;  // (JSON has no -inf; OpenAI uses -9999)
    if (kind == dialect::chat) {
      json top = json::array();
      for (const auto& [tid, l] : t.top) {
        auto [tt, tb] = spell(tid);
        top.push_back({{"token", tt}, {"logprob", std::isfinite(l) ? l : -9999.0}, {"bytes", tb}});
      }
      if (!into.contains("content")) into = {{"content", json::array()}, {"refusal", nullptr}};
      into["content"].push_back({{"token", text}, {"logprob", lp_value}, {"bytes", bytes}, {"top_logprobs", top}});
      return;
    }
    if (!into.contains("tokens"))
      into = {{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()}, {"text_offset", json::array()}};
    json top = json::object();
    for (const auto& [tid, l] : t.top) top[spell(tid).first] = std::isfinite(l) ? l : -9999.0;
    into["tokens"].push_back(text);
    into["token_logprobs"].push_back(lp_value);
    into["top_logprobs"].push_back(top);
    into["text_offset"].push_back(text_offset);
    text_offset += text.size();
  }

  // The role goes out with the first chunk of a chat stream.
  std::string role_event() {
    if (kind != dialect::chat || sent_role) return {};
    sent_role = true;
    return event(chunk(delta_choice({{"role", "assistant"}, {"content", ""}}, nullptr)));
  }
};

std::string error_event(const std::string& message) {
  return "data: " + json{{"error", {{"message", message}, {"type", "server_error"}, {"param", nullptr}, {"code", 500}}}}.dump() + "\n\n";
}

generation_stream make_stream(server_context& ctx, submission sub, std::shared_ptr<openai_state> st) {
  generation_stream g;
  g.handle = sub.handle;
  g.chunked = st->stream;
  g.content_type = st->stream ? "text/event-stream" : "application/json";
  g.on_piece = [st](const runtime::piece& p) -> std::string {
    if (p.token >= 0) st->clock.token(p.at);
    if (!st->stream) {
      st->text += p.text;
      if (st->logprobs && p.logprob && p.token >= 0) st->add_logprob(st->lp, p.token, *p.logprob);
      return {};
    }
    std::string out = st->role_event();
    if (st->logprobs && p.logprob && p.token >= 0) {
      // Each token's chunk carries its logprobs, even where its text is still held back.
      json one = json::object();
      st->add_logprob(one, p.token, *p.logprob);
      json choice = st->delta_choice({{"content", p.text}}, nullptr);
      choice["logprobs"] = std::move(one);
      out += openai_state::event(st->chunk(std::move(choice)));
    } else if (!p.text.empty()) {
      out += openai_state::event(st->chunk(st->delta_choice({{"content", p.text}}, nullptr)));
    }
    return out;
  };
  g.on_end = [st, h = sub.handle]() -> http_response {
    const auto why = h->finished();
    http_response r;
    if (why == runtime::finish_reason::error) {
      if (st->stream) {
        r.body = error_event(h->error()) + "data: [DONE]\n\n";
        return r;
      }
      r.status = 500;
      r.body = json{{"error", {{"message", h->error()}, {"type", "server_error"}, {"param", nullptr}, {"code", 500}}}}.dump();
      return r;
    }
    const char* finish = openai_finish_reason(why);
    if (st->stream) {
      r.body = st->role_event() + openai_state::event(st->chunk(st->delta_choice(json::object(), finish)));
      if (st->include_usage) {
        json u{{"id", st->id},
               {"object", st->kind == dialect::chat ? "chat.completion.chunk" : "text_completion"},
               {"created", st->created},
               {"model", st->model},
               {"choices", json::array()},
               {"usage", st->usage()}};
        r.body += openai_state::event(u);
      }
      r.body += "data: [DONE]\n\n";
      return r;
    }
    json logprobs = nullptr;
    if (st->logprobs)
      logprobs =
          !st->lp.empty() ? st->lp
          : st->kind == dialect::chat
              ? json{{"content", json::array()}, {"refusal", nullptr}}
              : json{{"tokens", json::array()}, {"token_logprobs", json::array()}, {"top_logprobs", json::array()}, {"text_offset", json::array()}};
    json choice =
        st->kind == dialect::chat
            ? json{{"index", 0}, {"message", {{"role", "assistant"}, {"content", st->text}}}, {"logprobs", logprobs}, {"finish_reason", finish}}
            : json{{"index", 0}, {"text", st->text}, {"logprobs", logprobs}, {"finish_reason", finish}};
    r.body = json{{"id", st->id},
                  {"object", st->kind == dialect::chat ? "chat.completion" : "text_completion"},
                  {"created", st->created},
                  {"model", st->model},
                  {"choices", json::array({choice})},
                  {"usage", st->usage()}}
                 .dump();
    return r;
  };
  g.on_close = [st, h = sub.handle](bool gone) { st->clock.finish(h->finished(), gone); };
  (void)ctx;
  return g;
}

request_limits limits_of(const server_context& ctx) { return {ctx.config.limits.max_tokens}; }

}  // namespace

route_result handle_completions(server_context& ctx, const http_request& r) {
  const auto req = parse_completion_request(parse_json_object(r), limits_of(ctx));
  const auto& m = resolve_model(ctx, req.model);
  std::vector<int32_t> prompt;
  if (req.suffix) {
    // OpenAI's `suffix`: the prompt is the text before the cursor, the suffix the text after.
    const auto fim = models::find_fim_tokens(*m.tokenizer);
    if (!fim.usable()) throw bad_request("model `" + m.name() + "` has no fill-in-the-middle tokens, so it cannot take a suffix", "suffix");
    if (!req.prompt) throw bad_request("a suffix needs a text prompt, not token ids", "prompt");
    models::infill_input in;
    in.prefix = *req.prompt;
    in.suffix = *req.suffix;
    prompt = models::build_infill_prompt(*m.tokenizer, fim, in, m.entry->context, m.entry->context, req.params.max_tokens);
  } else if (req.prompt_tokens) {
    prompt = *req.prompt_tokens;
  } else {
    prompt = tokenize_prompt(m, req.prompt.value_or(""));
  }
  auto params = req.params;
  if (req.prediction) params.prediction = tokenize_prediction(m, *req.prediction);
  params.constraint = compile_constraint(req.constraint, r.body);
  auto sub = submit_generation(ctx, m, std::move(prompt), std::move(params));
  auto st = std::make_shared<openai_state>(ctx, dialect::completion, m.name(), sub.prompt_tokens, r.received_at);
  st->stream = req.stream;
  st->include_usage = req.include_usage;
  st->predicted = req.prediction.has_value();
  st->logprobs = req.params.logprobs >= 0;
  st->tokenizer = m.tokenizer.get();
  st->handle = sub.handle;
  return make_stream(ctx, std::move(sub), st);
}

route_result handle_chat_completions(server_context& ctx, const http_request& r) {
  const auto req = parse_chat_request(parse_json_object(r), limits_of(ctx));
  const auto& m = resolve_model(ctx, req.model);
  auto params = req.params;
  if (req.prediction) params.prediction = tokenize_prediction(m, *req.prediction);
  params.constraint = compile_constraint(req.constraint, r.body);
  auto sub = submit_generation(ctx, m, tokenize_chat(m, req.messages, req.template_kwargs), std::move(params));
  auto st = std::make_shared<openai_state>(ctx, dialect::chat, m.name(), sub.prompt_tokens, r.received_at);
  st->stream = req.stream;
  st->include_usage = req.include_usage;
  st->predicted = req.prediction.has_value();
  st->logprobs = req.params.logprobs >= 0;
  st->tokenizer = m.tokenizer.get();
  st->handle = sub.handle;
  return make_stream(ctx, std::move(sub), st);
}

// llama.cpp's POST /apply-template: the chat request's conversation rendered with the model's
// template, not generated from.
route_result handle_apply_template(server_context& ctx, const http_request& r) {
  const auto req = parse_chat_request(parse_json_object(r), limits_of(ctx));
  const auto& m = resolve_model(ctx, req.model);
  http_response out;
  out.body = nlohmann::json{{"prompt", render_chat_text(m, req.messages, req.template_kwargs)}}.dump();
  out.content_type = "application/json";
  return out;
}

}  // namespace tandem::api
