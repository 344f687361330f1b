// Chat templates: recognise a model's prompt format from its GGUF Jinja template and render
// a conversation in that format, without a Jinja engine. Each family's rendering follows its
// official template exactly (see docs/chat-templates.md for the per-family strings).
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>

namespace tandem::models {

namespace jinja {
class program;
}

struct chat_message {
  std::string role;  // "system" | "user" | "assistant"; other roles are skipped
  std::string content;
};

enum class chat_template_kind { chatml, llama2, llama3, mistral, gemma, phi3, deepseek, zephyr, plain };

// "chatml", "llama2", ... (the names chat_template_name returns); nullopt when unknown.
std::optional<chat_template_kind> parse_chat_template_name(std::string_view name);
std::string_view chat_template_name(chat_template_kind k);

// Recognises the family of a GGUF tokenizer.chat_template by distinctive markers;
// plain when the text is empty or matches no family.
chat_template_kind detect_chat_template(std::string_view jinja);

// The BOS text the family's template writes itself ("<s>", "<|begin_of_text|>", "<bos>",
// "<｜begin▁of▁sentence｜>"); empty for families whose template leaves BOS to the tokenizer.
std::string_view chat_template_bos_text(chat_template_kind k);
// True when apply_chat_template's output starts with the BOS text: callers then encode it
// with add_bos=false (and special tokens parsed) so the model does not see BOS twice.
bool renders_bos(chat_template_kind k);

// System prompt the family's official template injects when the conversation has none
// (DeepSeek-Coder's); empty for the others.
std::string_view family_default_system_prompt(chat_template_kind k);

// A recognised template: the family plus the system prompt the model's own template injects
// when the conversation has none (SmolLM2: "You are a helpful AI assistant named SmolLM,
// trained by Hugging Face"; Qwen2: "You are a helpful assistant"). Empty: inject nothing.
struct chat_template {
  chat_template_kind kind = chat_template_kind::plain;
  std::string default_system;
  // The GGUF's own Jinja template, compiled (chat_jinja.h): when set, conversations are
  // rendered with it; `kind` stays the recognised family (for stop markers and the CLI).
  std::shared_ptr<const jinja::program> program;
};

// detect_chat_template plus the template's default system prompt: for chatml, the literal
// text of a "<|im_start|>system\n...<|im_end|>" the template writes on its own; for other
// families, family_default_system_prompt.
chat_template chat_template_from_jinja(std::string_view jinja);

// Renders msgs in the family's format, ending with the assistant prefix when
// add_generation_prompt (llama2 and mistral always end with "[/INST]", which is the prefix;
// phi3 ends with "<|endoftext|>" instead when !add_generation_prompt, as its template does).
// Uses family_default_system_prompt(k) when msgs has no system message.
// plain: one "System: ...", "User: ...", "Assistant: ..." line per message, then
// "Assistant:" (no trailing space or newline) as the generation prompt.
std::string apply_chat_template(chat_template_kind k, std::span<const chat_message> msgs, bool add_generation_prompt);
// As above, injecting t.default_system when msgs has no system message.
std::string apply_chat_template(const chat_template& t, std::span<const chat_message> msgs, bool add_generation_prompt);

}  // namespace tandem::models
