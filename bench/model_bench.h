// Throughput of one model on the CPU: prefill, single-sequence decode and batched decode,
// each repeated, measured through models::forward_context, by default in the arithmetic the
// engine (`tandem serve`) computes every row with; each phase can take `tandem run`'s instead.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "bench/stats.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/weight_type.h"
#include "models/model.h"

namespace tandem::bench {

struct model_bench_params {
  int64_t prompt = 512;  // prefill: tokens evaluated after `depth` ones (chunks of <= 512)
  int64_t gen = 128;     // decode: tokens evaluated one per pass after `depth` ones; batched
                         // decode: passes, each one token of every sequence
  int64_t batch = 8;     // batched decode: sequences per pass (1 .. models::k_max_sequences)
  // Tokens already in the cache when each timed prefill, decode and batched decode starts
  // (llama-bench's -d): an untimed prompt of this many tokens first (into every sequence of
  // the batch), by the server's arithmetic.
  int64_t depth = 0;
  int reps = 3;       // timed repetitions of each phase (after one untimed warm-up)
  uint64_t seed = 1;  // token ids
  // Prefill by the server's arithmetic (forward_context::set_prompt_end: the tiled attention
  // kernel, SwiGLU's vector e^x, packed Q4_1/Q5_1 in the tile's order), as `tandem serve`
  // computes prompts; off: llama.cpp's arithmetic (its f16 flash attention, `expf`, ggml's
  // Q4_1/Q5_1 order), as `tandem run` does.
  bool fast_prompt_attention = true;
  // Single-sequence decode by the same arithmetic, as the engine decodes a lone request; off:
  // llama.cpp's, as `tandem run`.
  bool fast_decode_attention = true;
  // Batched decode by the same arithmetic (runtime::engine_config::fast_attention, on by
  // default): batches of sequences exist only in the server. Off: llama.cpp's.
  bool fast_batched_attention = true;
  // Decode with a pool job per step (context_params::layer_teams off; on otherwise, the
  // default) and also on a second context whose layers each run as one team job, repetition
  // by repetition in alternating order, to compare the two.
  bool compare_layer_teams = false;
  // Prefill also by llama.cpp's arithmetic, in every repetition beside the prefill above
  // (the two alternating which goes first by repetition, so a slow spell of a shared machine
  // weighs on both): what `tandem run` computes a prompt with, next to what `tandem serve`
  // computes it with. Needs fast_prompt_attention on (run_model_bench throws otherwise).
  bool compare_prompt = false;
  // Every this many tokens of each timed single-sequence decode (0: never), the decode stops
  // its clock and runs run_model_bench's `during_decode` hook: run_bench reads the memory
  // ceiling there, so the ceiling a decode figure is compared with is sampled across the
  // same seconds instead of once after them.
  int64_t decode_pause_every = 0;
};

struct model_bench_result {
  // Per repetition, in measurement order.
  std::vector<double> prefill_tok_s;         // prompt / seconds of one eval of the whole prompt
  std::vector<double> decode_tok_s;          // gen / seconds of gen one-token evals
  std::vector<double> batched_decode_tok_s;  // batch * gen / seconds of gen decode passes
  // gen / seconds of gen one-token passes of one sequence in the batched decode's context and
  // arithmetic: the baseline batched decode is compared with (decode_tok_s runs on a
  // one-sequence context, and in llama.cpp's arithmetic where fast_decode_attention is off).
  std::vector<double> decode_as_batched_tok_s;
  std::vector<double> decode_gb_s;  // decode_bytes_per_token * decode_tok_s / 1e9
  // compare_layer_teams: decode_tok_s's measure with a team job per layer (empty otherwise).
  std::vector<double> decode_layer_teams_tok_s;
  // compare_prompt: prefill_tok_s's measure by llama.cpp's arithmetic (empty otherwise).
  std::vector<double> prefill_exact_tok_s;
  summary prefill, decode, batched_decode, decode_as_batched, decode_gb, decode_layer_teams, prefill_exact;
  uint64_t decode_bytes_per_token = 0;  // decode_weight_bytes(model)
  uint64_t int8_macs_per_token = 0;     // decode_int8_macs(model)
  // The position the first timed token of prefill, of decode and of batched decode (every
  // sequence's) took (the context's, read after the untimed fill): depth.
  int64_t prefill_start_position = 0, decode_start_position = 0, batched_start_position = 0;
};

// Deterministic pseudo-random token ids in [0, n_vocab): the same (n_vocab, n, seed) gives
// the same ids on every platform. Throughput does not depend on which ids are fed (llama.cpp's
// llama-bench feeds random ids too); random ones keep embedding-row reads from repeating.
std::vector<int32_t> bench_tokens(int64_t n_vocab, int64_t n, uint64_t seed);

// Weight bytes one single-sequence decode step reads: every tensor in full except
// token_embd.weight, of which one row is read (plus the whole table again when the output
// head is tied to it), at its file size, or at its packed size where the model packed it at
// load (kernels/cpu/packed.h). The KV cache is not counted.
uint64_t decode_weight_bytes(const models::model& m);

// Multiply-adds of one decode row through weight matrices whose products are int8 dots (the
// quantized types: activations are quantized to Q8_0 / Q8_1 / Q8_K): rows x cols of each such
// projection and of the output head. The embedding lookup and attention are not counted.
uint64_t decode_int8_macs(const models::model& m);

// The weight type holding the most bytes among the model's tensors (what a file is called
// by: "Q4_K" for a Q4_K_M file whose output head is Q6_K).
kernels::weight_type main_weight_type(const models::model& m);

// Runs the phases: prefill and decode on a one-sequence context (f16 KV cache, as
// llama.cpp's default; each repetition after an untimed fill of `depth` tokens), then, on a
// context of `batch` sequences each filled likewise, batched decode and one sequence decoded
// alone in the same arithmetic. Decode feeds
// ids from bench_tokens and never samples, so only the forward pass is timed. Throws
// std::invalid_argument for prompt, gen, reps, batch or depth out of range (a message naming the
// parameter), and what forward_context throws (e.g. not enough memory).
// after_decode_rep, when given, runs after each timed decode repetition, and during_decode
// every p.decode_pause_every tokens within one (before the last token's pause would fall
// after it), both outside the decode's timing: run_bench times passes of the read ceiling
// there, so each decode figure has a ceiling taken across it.
model_bench_result run_model_bench(const models::model& m, kernels::cpu::thread_pool& pool, const model_bench_params& p,
                                   const std::function<void()>& after_decode_rep = {}, const std::function<void()>& during_decode = {});

}  // namespace tandem::bench
