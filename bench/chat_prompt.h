// A benchmark's request text as the model sees it: a user message in the model's chat
// template (when it has one and `chat`), as `tandem run --chat` renders it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "models/model.h"
#include "models/tokenizer.h"

namespace tandem::bench {

std::vector<int32_t> chat_prompt_tokens(const models::model& m, const models::tokenizer& tok, const std::string& text, bool chat);

}  // namespace tandem::bench
