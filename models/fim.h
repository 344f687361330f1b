// Fill-in-the-middle prompts for code models: which marker tokens a vocabulary has, and the
// token sequence llama.cpp's /infill builds from a prefix, a suffix, the text typed so far
// and extra context (other files), so that a client tuned against llama-server gets the
// same prompt here. Used by /infill, /v1/completions with `suffix` and Ollama's
// /api/generate with `suffix`.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "models/tokenizer.h"

namespace tandem::models {

// Marker token ids, -1 when the vocabulary has none (see vocab::fim for where they come from).
struct fim_tokens {
  int32_t pre = -1;  // starts the prefix (the code before the cursor)
  int32_t suf = -1;  // starts the suffix (the code after the cursor)
  int32_t mid = -1;  // asks for the middle; generation continues from here
  int32_t pad = -1;  // padding; ends generation when emitted
  int32_t rep = -1;  // starts a repository name (repository-level prompts)
  int32_t sep = -1;  // starts a file: its name, a newline, its text
  // Whether a FIM prompt can be built at all: pre, suf and mid are present.
  bool usable() const { return pre >= 0 && suf >= 0 && mid >= 0; }
};

// The vocabulary's markers; check usable() before building a prompt.
fim_tokens find_fim_tokens(const tokenizer& t);

struct infill_input {
  std::string prefix;  // code before the cursor
  std::string suffix;  // code after the cursor
  std::string middle;  // text already typed at the cursor (llama.cpp's "prompt"), continued by the model
  // Other files as {filename, text}, oldest first: the part of them that fits is taken from
  // the end. llama.cpp names a chunk without a filename "tmp"; callers pass that themselves.
  std::vector<std::pair<std::string, std::string>> extra;
};

// The prompt tokens, in llama.cpp's order:
//   extra context, [BOS], [PRE] prefix middle, [SUF] suffix, [MID]
// (prefix and suffix parts swapped when spm_order). The extra context is repository-level
// when the vocabulary has the tokens: [REP] "myproject\n" when it has REP; with SEP each
// chunk is [SEP] name "\n" text and a closing [SEP] "filename\n" follows them, without SEP
// each chunk's text follows "\n\n--- snippet ---\n\n".
// The budget follows llama.cpp: the last 3*(n_batch/4) prefix tokens, the first
// n_batch/4 - 2 - len(middle) suffix tokens, the last n_ctx - n_batch - 2*n_predict extra
// tokens (none when that is not positive; a negative n_predict, meaning no limit, counts as
// -1 as in llama.cpp, negative sizes as 0); the middle is always whole. BOS is added when
// the vocabulary adds one. User text is tokenized without parsing special tokens, so code
// that contains marker texts stays text. Each piece is tokenized on its own, as llama.cpp
// does, so with an SPM vocabulary that adds a space prefix every non-empty piece starts
// with a space (the middle too, though it continues the prefix).
// Throws std::invalid_argument when !f.usable().
std::vector<int32_t> build_infill_prompt(const tokenizer& t, const fim_tokens& f, const infill_input& in, int64_t n_ctx, int64_t n_batch,
                                         int64_t n_predict, bool spm_order = false);

}  // namespace tandem::models
