#include "models/chat_jinja.h"

namespace tandem::models {

std::shared_ptr<const jinja::program> compile_chat_template(std::string_view source) {
  if (source.empty()) return nullptr;
  return std::make_shared<const jinja::program>(source);
}

nlohmann::ordered_json messages_json(std::span<const chat_message> msgs) {
  auto out = nlohmann::ordered_json::array();
  for (const auto& m : msgs) out.push_back({{"role", m.role}, {"content", m.content}});
  return out;
}

namespace {
std::string special_text(const tokenizer& tok, int32_t id) { return id >= 0 ? tok.token_to_piece(id, true) : std::string(); }
}  // namespace

std::string render_chat(const jinja::program& program, const tokenizer& tok, const chat_render_input& in) {
  nlohmann::ordered_json ctx = nlohmann::ordered_json::object();
  // The request's own variables first: the standard ones below cannot be overridden by them.
  for (const auto& [k, v] : in.kwargs.items()) ctx[k] = v;
  ctx["messages"] = in.messages;
  if (!in.tools.is_null()) ctx["tools"] = in.tools;
  ctx["add_generation_prompt"] = in.add_generation_prompt;
  ctx["bos_token"] = special_text(tok, tok.bos());
  ctx["eos_token"] = special_text(tok, tok.eos());
  return program.render(jinja::value::from_json(ctx));
}

bool starts_with_bos(const tokenizer& tok, std::string_view text) {
  if (tok.bos() < 0) return false;
  const std::string bos = special_text(tok, tok.bos());
  return !bos.empty() && text.starts_with(bos);
}

}  // namespace tandem::models
