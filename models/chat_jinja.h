// A conversation rendered with a model's own Jinja chat template (models/jinja), with the
// variables Hugging Face's apply_chat_template passes: messages (as the request gave them:
// role, content, and for later use tool_calls, tool_call_id, name), tools, add_generation_prompt,
// bos_token and eos_token, and the request's chat_template_kwargs (enable_thinking, ...).
#pragma once

#include <nlohmann/json.hpp>

#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "models/chat_template.h"
#include "models/jinja/template.h"
#include "models/tokenizer.h"

namespace tandem::models {

struct chat_render_input {
  nlohmann::ordered_json messages = nlohmann::ordered_json::array();
  nlohmann::ordered_json tools;  // null: none
  bool add_generation_prompt = true;
  nlohmann::ordered_json kwargs = nlohmann::ordered_json::object();  // the template's own variables
};

// Compiles a GGUF's tokenizer.chat_template; null for an empty one. Throws jinja::error
// naming the line for one that does not parse.
std::shared_ptr<const jinja::program> compile_chat_template(std::string_view source);

// The messages of a plain conversation, as the template sees them.
nlohmann::ordered_json messages_json(std::span<const chat_message> msgs);

// Renders `in` with `program`; bos_token and eos_token are the tokenizer's texts. Throws
// jinja::raised when the template refuses the conversation and jinja::error when it fails.
std::string render_chat(const jinja::program& program, const tokenizer& tok, const chat_render_input& in);

// Whether `text` starts with the tokenizer's BOS text: a template that writes BOS itself
// must not get a second one from the tokenizer.
bool starts_with_bos(const tokenizer& tok, std::string_view text);

}  // namespace tandem::models
