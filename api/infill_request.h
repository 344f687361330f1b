// Parsing of llama.cpp's POST /infill body, the fill-in-the-middle route editor plugins
// (llama.vim, llama.vscode) call on every keystroke. Lenient as llama.cpp is about keys: the
// plugins send many this server has no use for, so unknown keys are ignored; a known key of
// the wrong type or out of range is a 400 api_error (invalid_request_error) naming it.
// Null counts as absent.
//
// Sampling uses llama.cpp's names and defaults: temperature 0.8, top_k 40, top_p 0.95,
// min_p 0.05, repeat_penalty 1.0, repeat_last_n 64, no presence/frequency penalty, seed -1
// (random); n_predict -1 (unbounded).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "api/generation_request.h"

namespace tandem::api {

// One chunk of extra context (another file, or another part of this one) placed before the FIM
// prefix, where it stays in the prefix cache while the cursor moves.
struct infill_chunk {
  std::string filename = "tmp";  // llama.cpp's default name
  std::string text;
};

struct infill_request {
  // model (empty when the request names none: the route picks its FIM model), params
  // (max_tokens -1: unbounded; 0: evaluate the prompt into the cache only, the plugins'
  // warm-up) and stream. gen.prompt, prompt_tokens, suffix and messages stay empty.
  parsed_generation gen;
  std::string input_prefix;  // text before the cursor
  std::string input_suffix;  // text after the cursor
  std::string prompt;        // the middle typed so far: goes after the prefix
  std::vector<infill_chunk> input_extra;
  bool cache_prompt = true;                  // the prefix cache is always on; kept for the response
  int64_t t_max_predict_ms = 0;              // generation time limit once a newline is out; 0: none
  int64_t t_max_prompt_ms = 0;               // prompt processing time limit; 0: none
  int64_t n_indent = 0;                      // minimum indentation of generated lines; 0: none
  int64_t id_slot = -1;                      // the client's slot hint; -1: any
  std::vector<std::string> samplers;         // validated, not used: the chain is fixed (sampler.h)
  std::vector<std::string> response_fields;  // "a/b" paths the response keeps; empty: all
};

// Requires input_prefix and input_suffix (strings, may be empty), as llama.cpp does. n_cmpl
// (alternatives wanted, 1 to 16) is accepted and one completion is served.
infill_request parse_infill(const nlohmann::json& body, const request_limits& limits);
// llama.cpp's POST /completion: the same fields, with prompt (required: text, or token ids
// into gen.prompt_tokens) instead of the FIM ones; grammar / json_schema as constraint.h reads
// them.
infill_request parse_llama_completion(const nlohmann::json& body, const request_limits& limits);

}  // namespace tandem::api
