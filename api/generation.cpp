#include "api/generation.h"

#include "models/chat_jinja.h"

#include <ctime>
#include <random>

#include "api/api_error.h"

namespace tandem::api {

std::vector<int32_t> tokenize_prompt(const runtime::served_model& m, const std::string& text) {
  return m.tokenizer->encode(text, m.tokenizer->add_bos(), /*parse_special=*/true);
}

std::vector<int32_t> tokenize_prediction(const runtime::served_model& m, const std::string& text) {
  // Text the answer continues into: no BOS, and special-token texts stay text.
  auto ids = m.tokenizer->encode(text, false, false);
  if (static_cast<int64_t>(ids.size()) > m.entry->context)
    throw bad_request("the prediction is " + std::to_string(ids.size()) + " tokens, more than the " + std::to_string(m.entry->context) +
                          " of model `" + m.name() + "`'s context",
                      "prediction.content");
  return ids;
}

std::string render_chat_text(const runtime::served_model& m, std::span<const models::chat_message> messages,
                             const nlohmann::ordered_json& template_kwargs) {
  if (!m.chat.program) return models::apply_chat_template(m.chat, messages, /*add_generation_prompt=*/true);
  models::chat_render_input in;
  in.messages = models::messages_json(messages);
  if (template_kwargs.is_object()) in.kwargs = template_kwargs;
  try {
    return models::render_chat(*m.chat.program, *m.tokenizer, in);
  } catch (const models::jinja::raised& e) {
    throw bad_request("model `" + m.name() + "`'s chat template refuses this conversation: " + e.message, "messages");
  } catch (const models::jinja::error& e) {
    throw bad_request("model `" + m.name() + "`'s chat template failed on this conversation: " + std::string(e.what()), "messages");
  }
}

std::vector<int32_t> tokenize_chat(const runtime::served_model& m, std::span<const models::chat_message> messages,
                                   const nlohmann::ordered_json& template_kwargs) {
  const std::string text = render_chat_text(m, messages, template_kwargs);
  // A template that writes BOS itself must not get a second one from the tokenizer.
  if (m.chat.program) return m.tokenizer->encode(text, m.tokenizer->add_bos() && !models::starts_with_bos(*m.tokenizer, text), true);
  const bool bos = m.tokenizer->add_bos() && !models::renders_bos(m.chat.kind);
  return m.tokenizer->encode(text, bos, /*parse_special=*/true);
}

submission submit_generation(server_context& ctx, const runtime::served_model& m, std::vector<int32_t> prompt, runtime::generation_params params) {
  const int64_t context = m.entry->context;
  const auto n = static_cast<int64_t>(prompt.size());
  if (n == 0) throw bad_request("the prompt is empty", "prompt");
  const int64_t cap = ctx.config.limits.max_tokens;
  if (n >= context || (params.max_tokens > 0 && n + params.max_tokens > context)) {
    std::string msg = "This model's maximum context length is " + std::to_string(context) + " tokens. However, you requested " +
                      std::to_string(n + std::max<int64_t>(params.max_tokens, 0)) + " tokens (" + std::to_string(n) + " in the prompt, " +
                      std::to_string(std::max<int64_t>(params.max_tokens, 0)) +
                      " for the completion). Please reduce the prompt or the completion length.";
    api_error e(400, "invalid_request_error", std::move(msg), params.max_tokens > 0 && n < context ? "max_tokens" : "prompt",
                "context_length_exceeded");
    throw e;
  }
  if (params.max_tokens < 0) params.max_tokens = std::min(context - n, cap);
  submission s;
  s.prompt_tokens = n;
  s.max_tokens = params.max_tokens;
  try {
    s.handle = ctx.served.executor().submit({m.name(), std::move(prompt), std::move(params)});
  } catch (const runtime::queue_full& e) {
    api_error err(429, "rate_limit_error", e.what(), {}, "queue_full");
    err.retry_after_s = 1;
    throw err;
  } catch (const std::invalid_argument& e) {
    throw bad_request(e.what());
  }
  return s;
}

request_clock::request_clock(server_context& ctx, std::string model, std::string route, int64_t prompt_tokens, clock::time_point arrived)
    : ctx_(ctx), model_(std::move(model)), route_(std::move(route)), prompt_tokens_(prompt_tokens), start_(arrived) {}

void request_clock::token(clock::time_point at) {
  // The engine's release time, not when the strand got to it: a write in flight makes the
  // session take several pieces at once.
  const auto now = at == clock::time_point{} ? clock::now() : at;
  const labels l{{"model", model_}};
  if (generated_ == 0) {
    first_ = now;
    ctx_.metrics.observe("tandem_time_to_first_token_seconds", l, std::chrono::duration<double>(now - start_).count());
  } else {
    ctx_.metrics.observe("tandem_inter_token_latency_seconds", l, std::chrono::duration<double>(now - last_).count());
  }
  last_ = now;
  ++generated_;
}

void request_clock::finish(runtime::finish_reason why, bool client_gone) {
  if (done_) return;
  done_ = true;
  const char* outcome = client_gone                                                                       ? "disconnected"
                        : why == runtime::finish_reason::error                                            ? "error"
                        : why == runtime::finish_reason::cancelled                                        ? "cancelled"
                        : why == runtime::finish_reason::length || why == runtime::finish_reason::context ? "length"
                                                                                                          : "stop";
  const labels l{{"model", model_}};
  ctx_.metrics.add("tandem_requests_total", {{"model", model_}, {"route", route_}, {"outcome", outcome}});
  ctx_.metrics.add("tandem_prompt_tokens_total", l, static_cast<double>(prompt_tokens_));
  ctx_.metrics.add("tandem_generation_tokens_total", l, static_cast<double>(generated_));
  ctx_.metrics.observe("tandem_e2e_request_latency_seconds", l, std::chrono::duration<double>(clock::now() - start_).count());
}

double request_clock::prompt_ms() const {
  const auto end = generated_ > 0 ? first_ : clock::now();
  return std::chrono::duration<double, std::milli>(end - start_).count();
}

double request_clock::predict_ms() const { return generated_ > 0 ? std::chrono::duration<double, std::milli>(last_ - first_).count() : 0.0; }

double request_clock::total_ms() const { return std::chrono::duration<double, std::milli>(clock::now() - start_).count(); }

const char* openai_finish_reason(runtime::finish_reason r) {
  switch (r) {
    case runtime::finish_reason::length:
    case runtime::finish_reason::context:
    case runtime::finish_reason::cancelled:
      return "length";
    default:
      return "stop";
  }
}

std::string make_id(const char* prefix) {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static constexpr char hex[] = "0123456789abcdef";
  std::string id = prefix;
  for (int i = 0; i < 24; ++i) id += hex[rng() & 15];
  return id;
}

int64_t unix_seconds() { return std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count(); }

std::string rfc3339(std::chrono::system_clock::time_point t) {
  const auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(t.time_since_epoch()).count();
  const std::time_t secs = static_cast<std::time_t>(ns / 1'000'000'000);
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[64];
  const size_t n = std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
  char frac[16];
  std::snprintf(frac, sizeof frac, ".%09lldZ", static_cast<long long>(ns % 1'000'000'000));
  return std::string(buf, n) + frac;
}

std::string rfc3339_now() { return rfc3339(std::chrono::system_clock::now()); }

}  // namespace tandem::api
