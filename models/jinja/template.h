// A Jinja chat template (the GGUF's `tokenizer.chat_template`) rendered as Hugging Face's
// transformers renders it with Python's jinja2: trim_blocks and lstrip_blocks on, the
// loopcontrols extension ({% break %}, {% continue %}), transformers' `tojson` (json.dumps,
// ensure_ascii off, keys in their order), `raise_exception(message)` and
// `strftime_now(format)`, and `{% generation %}` rendered as its content. Supported: the
// statements of parser.h, jinja2's filters, tests and string and dict methods that chat
// templates use (builtins.h lists them); unknown ones are errors naming them.
#pragma once

#include <cstdint>
#include <ctime>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "models/jinja/ast.h"
#include "models/jinja/error.h"
#include "models/jinja/value.h"

namespace tandem::models::jinja {

struct render_options {
  // Statements, loop iterations and calls one render may run, and macro calls nested: a
  // template that loops or recurses without end fails with an error instead of hanging.
  int64_t max_steps = 1'000'000;
  int max_depth = 64;
  size_t max_output = 16u << 20;  // bytes of text one render may write
  std::optional<std::tm> now;     // what strftime_now formats; none: the local time when it is called
};

class program {
 public:
  // Throws jinja::error naming the line for a syntax error.
  explicit program(std::string_view source);
  // Renders with `context` (a dict: messages, tools, add_generation_prompt, bos_token, ...).
  // Throws jinja::raised for the template's raise_exception, jinja::error for anything else
  // that fails (an unknown filter, a type error, the step limit).
  std::string render(const value& context, const render_options& o = {}) const;

 private:
  std::shared_ptr<const body> body_;
};

}  // namespace tandem::models::jinja
