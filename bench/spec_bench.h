// `tandem bench spec`: what speculative decoding gains on one model. The same greedy request is
// decoded plainly and speculatively in one engine in the same process, the two alternating
// which runs first by repetition (a slow spell of a shared machine weighs on both), with one
// proposer: a draft model, n-gram lookup over the sequence, or an OpenAI-style prediction.
// Decode speed counts the tokens after the first (the prompt's pass is not decode).
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

#include "bench/stats.h"

namespace tandem::bench {

enum class spec_bench_method { draft, ngram, prediction };

struct spec_bench_options {
  std::string model_path;
  spec_bench_method method = spec_bench_method::ngram;
  std::string draft_path;  // method draft: the draft model's GGUF file
  // The request's text; empty: a built-in one for the method, on a small Python class
  // (prediction: rename one of its methods; otherwise: write a Queue class in its style).
  std::string prompt;
  // method prediction: the predicted output; empty: the first ``` fenced block of the prompt.
  std::string prediction;
  bool chat = true;  // the prompt as a user message in the model's chat template (when it has one)
  int64_t gen = 128;
  int64_t max_draft = 8;   // proposals verified in one pass, at most
  bool cost_aware = true;  // a draft guesses only what pays (runtime::engine_config::spec_cost_aware)
  int reps = 3;
  int threads = 0;  // 0: all cores
};

struct spec_bench_result {
  std::string model_path, draft_path, method;
  bool cost_aware = true;
  int64_t prompt_tokens = 0, prediction_tokens = 0;
  int threads = 0, reps = 0;
  bool same_vocabulary = true;  // draft: the draft's token ids pass straight
  summary decode_tok_s_plain, decode_tok_s_spec;
  summary speedup;                     // per repetition: spec over plain of the same repetition
  int64_t proposed = 0, accepted = 0;  // tokens, over every timed speculative run
  double acceptance_rate = 0;          // accepted / proposed (0 when nothing was proposed)
  double tokens_per_pass = 0;          // decoded tokens per target pass of the speculative runs
  double draft_ms_per_token = 0;       // the draft model's passes per decoded token (0 without one)
  int64_t generated = 0;               // tokens of one run (the plain one of the first repetition)
  std::string output;                  // its text
  bool identical = true;               // every speculative output equals the plain one, token for token
};

// Throws what loading the models throws, std::invalid_argument for options out of range or a
// prediction method with nothing to predict, and std::runtime_error when a run fails.
spec_bench_result run_spec_bench(const spec_bench_options& o);

// The keys (decode_tok_s_plain, decode_tok_s_spec, speedup, acceptance_rate,
// tokens_per_pass, draft_ms_per_token, identical; medians, "<name>_min" / "_max" beside them)
// and the settings.
nlohmann::json to_json(const spec_bench_result& r);
std::string format_table(const spec_bench_result& r);

const char* spec_bench_method_name(spec_bench_method m);

}  // namespace tandem::bench
