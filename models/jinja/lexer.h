// Splits a template into text and the tokens of its tags, as jinja2's lexer does with the
// settings Hugging Face's chat templates are rendered with (trim_blocks and lstrip_blocks on,
// as in transformers): the first newline after a block or comment tag is dropped, spaces and
// tabs before one on its line are dropped, and `-` inside a tag's delimiter strips all
// whitespace on that side (`+` keeps what trim_blocks or lstrip_blocks would drop). One
// newline at the very end of the source is dropped, as jinja2 does.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tandem::models::jinja {

struct token {
  enum class kind { text, var_begin, var_end, block_begin, block_end, name, string, integer, number, op, end };
  kind k = kind::end;
  std::string text;  // text, name, operator, or a string literal's decoded value
  int line = 1;
};

// Throws jinja::error naming the line for an unterminated tag, comment or string, or a
// character that starts no token.
std::vector<token> tokenize(std::string_view source);

}  // namespace tandem::models::jinja
