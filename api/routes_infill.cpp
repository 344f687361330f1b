// POST /infill, as llama.cpp's server answers it for editor plugins (llama.vim,
// llama.vscode): the FIM prompt built from prefix, suffix, typed middle and extra context
// chunks (repo-level layout when the model has the tokens), `n_predict: 0` warm-ups that only
// fill the prefix cache, t_max_predict_ms, n_indent, and response_fields.
#include <memory>

#include <nlohmann/json.hpp>

#include "api/api_error.h"
#include "api/generation.h"
#include "api/indent_gate.h"
#include "api/infill_request.h"
#include "api/json_body.h"
#include "api/routes.h"
#include "models/fim.h"

namespace tandem::api {

using nlohmann::json;

namespace {

// The model an /infill without "model" goes to: the first code model with FIM tokens, else
// the first model with them.
const runtime::served_model* default_fim_model(server_context& ctx) {
  const runtime::served_model* any = nullptr;
  for (const auto& m : ctx.served.models()) {
    if (!models::find_fim_tokens(*m->tokenizer).usable()) continue;
    if (m->entry->role == configs::model_role::code) return m.get();
    if (!any) any = m.get();
  }
  return any;
}

struct infill_state {
  std::string model, content;
  bool stream = false;
  int64_t t_max_predict_ms = 0;
  bool timed_out = false;  // t_max_predict_ms or n_indent ended it
  bool newline = false;
  indent_gate indent;
  std::vector<std::string> fields;
  request_clock clock;
  infill_state(server_context& ctx, std::string m, const char* route, int64_t prompt_tokens, request_clock::clock::time_point arrived)
      : model(std::move(m)), clock(ctx, model, route, prompt_tokens, arrived) {}

  json final_object(runtime::finish_reason why, const std::string& all_content) const {
    const char* stop_type = timed_out                                                                         ? "limit"
                            : why == runtime::finish_reason::eog                                              ? "eos"
                            : why == runtime::finish_reason::stop                                             ? "word"
                            : why == runtime::finish_reason::length || why == runtime::finish_reason::context ? "limit"
                                                                                                              : "none";
    const double pms = clock.prompt_ms(), gms = clock.predict_ms();
    const auto pn = clock.prompt_tokens(), gn = clock.generated();
    json j{{"content", all_content},
           {"id_slot", 0},
           {"stop", true},
           {"model", model},
           {"tokens_predicted", gn},
           {"tokens_evaluated", pn},
           {"stop_type", stop_type},
           {"stopping_word", ""},
           {"tokens_cached", pn + gn},
           {"truncated", false},
           {"timings",
            {{"prompt_n", pn},
             {"prompt_ms", pms},
             {"prompt_per_token_ms", pn > 0 ? pms / static_cast<double>(pn) : 0.0},
             {"prompt_per_second", pms > 0 ? 1000.0 * static_cast<double>(pn) / pms : 0.0},
             {"predicted_n", gn},
             {"predicted_ms", gms},
             {"predicted_per_token_ms", gn > 0 ? gms / static_cast<double>(gn) : 0.0},
             {"predicted_per_second", gms > 0 ? 1000.0 * static_cast<double>(gn) / gms : 0.0}}}};
    if (fields.empty()) return j;
    // llama.cpp's response_fields: keep only these, "a/b" paths flattened to top-level keys.
    json kept = json::object();
    for (const auto& f : fields) {
      if (f.empty()) continue;
      try {
        const json::json_pointer ptr("/" + f);
        if (j.contains(ptr)) kept[f] = j.at(ptr);
      } catch (const json::exception&) {
        // Not a path ("a~2"): nothing to keep, as for a field that does not exist.
      }
    }
    return kept;
  }
};

route_result stream_llama(server_context& ctx, const http_request& r, const runtime::served_model& m, std::vector<int32_t> prompt,
                          const infill_request& req, const char* route);

}  // namespace

route_result handle_infill(server_context& ctx, const http_request& r) {
  const auto req = parse_infill(parse_json_object(r), {ctx.config.limits.max_tokens});
  const runtime::served_model* m = nullptr;
  if (!req.gen.model.empty()) {
    m = &resolve_model(ctx, req.gen.model);
  } else {
    m = default_fim_model(ctx);
    if (!m) throw bad_request("no served model has fill-in-the-middle tokens; /infill needs a code model with them", "model");
  }
  const auto fim = models::find_fim_tokens(*m->tokenizer);
  if (!fim.usable())
    throw bad_request(
        "model `" + m->name() + "` has no fill-in-the-middle tokens (prefix, suffix and middle markers); /infill needs a code model with them",
        "model");
  models::infill_input in;
  in.prefix = req.input_prefix;
  in.suffix = req.input_suffix;
  in.middle = req.prompt;
  for (const auto& c : req.input_extra) in.extra.emplace_back(c.filename, c.text);
  const int64_t context = m->entry->context;
  // Prefix and suffix get half the context between them, the extra chunks what is left
  // after the generation's room (llama.cpp's budget with n_batch = context / 2).
  return stream_llama(ctx, r, *m, models::build_infill_prompt(*m->tokenizer, fim, in, context, context / 2, req.gen.params.max_tokens), req,
                      "infill");
}

// llama.cpp's POST /completion: a plain prompt (text or token ids), answered as /infill is.
route_result handle_llama_completion(server_context& ctx, const http_request& r) {
  const auto req = parse_llama_completion(parse_json_object(r), {ctx.config.limits.max_tokens});
  const runtime::served_model* m = nullptr;
  if (!req.gen.model.empty()) {
    m = &resolve_model(ctx, req.gen.model);
  } else {
    // llama.cpp's server has one model; here the first chat model stands for it.
    for (const auto& s : ctx.served.models())
      if (!m || (s->entry->role == configs::model_role::chat && m->entry->role != configs::model_role::chat)) m = s.get();
    if (!m) throw bad_request("no model is served", "model");
  }
  auto prompt = req.gen.prompt_tokens ? *req.gen.prompt_tokens : tokenize_prompt(*m, req.gen.prompt.value_or(""));
  return stream_llama(ctx, r, *m, std::move(prompt), req, "completion");
}

namespace {

route_result stream_llama(server_context& ctx, const http_request& r, const runtime::served_model& model, std::vector<int32_t> prompt,
                          const infill_request& req, const char* route) {
  const runtime::served_model* m = &model;
  auto params = req.gen.params;
  params.constraint = compile_constraint(req.gen.constraint, r.body);
  auto sub = submit_generation(ctx, *m, std::move(prompt), std::move(params));
  auto st = std::make_shared<infill_state>(ctx, m->name(), route, sub.prompt_tokens, r.received_at);
  st->stream = req.gen.stream;
  st->t_max_predict_ms = req.t_max_predict_ms;
  st->indent = indent_gate(req.n_indent);
  st->fields = req.response_fields;

  generation_stream g;
  g.handle = sub.handle;
  g.chunked = st->stream;
  g.content_type = st->stream ? "text/event-stream" : "application/json";
  g.on_piece = [st, h = sub.handle](const runtime::piece& p) -> std::string {
    if (p.token >= 0) st->clock.token(p.at);
    const std::string text = st->indent.pass(p.text);
    if (st->indent.closed() && !st->timed_out) {
      st->timed_out = true;
      h->cancel();
    }
    st->content += text;
    if (text.find('\n') != std::string::npos) st->newline = true;
    // llama.cpp's t_max_predict_ms: once a line is complete, stop when the time is up.
    if (st->t_max_predict_ms > 0 && st->newline && !st->timed_out && st->clock.predict_ms() >= static_cast<double>(st->t_max_predict_ms)) {
      st->timed_out = true;
      h->cancel();
    }
    if (!st->stream || text.empty()) return {};
    return "data: " + json{{"content", text}, {"stop", false}, {"id_slot", 0}}.dump() + "\n\n";
  };
  g.on_end = [st, h = sub.handle]() -> http_response {
    http_response res;
    const auto why = h->finished();
    if (why == runtime::finish_reason::error) {
      json e{{"error", {{"message", h->error()}, {"type", "server_error"}, {"code", 500}}}};
      if (st->stream) {
        res.body = "error: " + e["error"].dump() + "\n\n";
      } else {
        res.status = 500;
        res.body = e.dump();
      }
      return res;
    }
    // Streamed, the text went out piece by piece: the last event carries none.
    res.body = st->stream ? "data: " + st->final_object(why, "").dump() + "\n\n" : st->final_object(why, st->content).dump();
    return res;
  };
  g.on_close = [st, h = sub.handle](bool gone) { st->clock.finish(st->timed_out ? runtime::finish_reason::length : h->finished(), gone); };
  return g;
}

}  // namespace

}  // namespace tandem::api
