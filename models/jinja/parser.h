// Parses a template's tokens (lexer.h) into statements (ast.h): if / elif / else, for (with
// an `if` filter, tuple unpacking and else), set (names, unpacking, namespace attributes,
// and the block form), macro, filter blocks, break / continue, and the `generation` block of
// transformers' templates (rendered as its content); expressions with jinja2's precedence.
#pragma once

#include <string_view>

#include "models/jinja/ast.h"

namespace tandem::models::jinja {

// Throws jinja::error naming the line for any syntax error or an unknown statement.
body parse(std::string_view source);

}  // namespace tandem::models::jinja
