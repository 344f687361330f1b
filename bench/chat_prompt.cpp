#include "bench/chat_prompt.h"

#include "models/chat_template.h"

namespace tandem::bench {

std::vector<int32_t> chat_prompt_tokens(const models::model& m, const models::tokenizer& tok, const std::string& text, bool chat) {
  const std::string jinja = m.file().get_string("tokenizer.chat_template").value_or("");
  if (!chat || jinja.empty()) return tok.encode(text, tok.add_bos(), /*parse_special=*/true);
  // The model's template family without its injected system prompt.
  auto tmpl = models::chat_template_from_jinja(jinja);
  tmpl.default_system.clear();
  const std::vector<models::chat_message> msgs{{"user", text}};
  const std::string rendered = models::apply_chat_template(tmpl, msgs, /*add_generation_prompt=*/true);
  return tok.encode(rendered, tok.add_bos() && !models::renders_bos(tmpl.kind), /*parse_special=*/true);
}

}  // namespace tandem::bench
