// `tandem bench grammar`: what constrained decoding costs. The model decodes the same greedy
// request with and without a JSON schema in one engine, alternating which runs first; then the
// constrained answer is replayed, token by token, through a fresh matcher (a new request's
// cold state: every first visit of a state pays its trie walk) on the model's vocabulary and
// on each --vocab file, timing the mask and the advance per token; and a random walk over the
// allowed tokens stresses states a model would rarely visit.
#pragma once

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "bench/stats.h"

namespace tandem::bench {

struct grammar_bench_options {
  std::string model_path;
  std::vector<std::string> vocab_paths;  // more vocabularies (GGUF files) to time the mask on
  std::string schema;                    // JSON Schema text; empty: a built-in one (a record with strings, numbers, an enum array)
  std::string prompt;                    // empty: asks for a JSON record fitting the built-in schema
  int64_t gen = 128;
  int reps = 3;
  int random_steps = 1000;
  int threads = 0;  // 0: all cores
};

struct grammar_vocab_figures {
  std::string path;
  int32_t n_vocab = 0;
  int64_t replay_tokens = 0;       // the answer in this vocabulary's tokens
  summary mask_us_per_token;       // replay: mask + advance per token, cold matcher each repetition
  double random_us_per_token = 0;  // random walk: the same per step
  double mask_pct_of_decode = 0;   // mask_us_per_token (median) over the model's plain decode step
  int64_t states = 0;              // matcher states the replay visited
};

struct grammar_bench_result {
  std::string model_path;
  int threads = 0, reps = 0;
  int64_t prompt_tokens = 0, generated = 0;
  std::string output;                              // the constrained answer (greedy)
  bool valid = false;                              // it parses as JSON
  summary decode_ms_plain, decode_ms_constrained;  // per decoded token, in the engine
  summary overhead_pct;                            // per repetition: constrained over plain, less 100
  std::vector<grammar_vocab_figures> vocabs;       // the model's first
};

// Throws what loading the files throws, schema_error / grammar_error for a bad schema,
// std::invalid_argument for options out of range, std::runtime_error when a run fails.
grammar_bench_result run_grammar_bench(const grammar_bench_options& o);

// The keys: mask_us_per_token (per vocabulary, with n_vocab), mask_pct_of_decode,
// decode_ms_plain, decode_ms_constrained, overhead_pct (medians, "_min" / "_max" beside).
nlohmann::json to_json(const grammar_bench_result& r);
std::string format_table(const grammar_bench_result& r);

}  // namespace tandem::bench
