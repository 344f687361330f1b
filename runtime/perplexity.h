// The perplexity of a token sequence under a model, as llama.cpp's `llama-perplexity` measures
// it: the tokens cut into chunks of n_ctx, each evaluated from an empty cache with its first
// token replaced by BOS, and the second half of each chunk scored (every position there has at
// least n_ctx / 2 tokens of context). `tandem perplexity` prints it, so the quality cost of a
// KV cache type is measured rather than assumed.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "kernels/cpu/ops.h"
#include "kernels/cpu/thread_pool.h"
#include "models/model.h"

namespace tandem::runtime {

struct perplexity_params {
  int64_t n_ctx = 512;      // tokens per chunk (at least 2)
  int64_t max_chunks = -1;  // -1: every whole chunk of the text
  kernels::cpu::kv_type kv = kernels::cpu::kv_type::f16;
  bool kv_rotate = false;   // models::context_params::kv_rotate
  int64_t max_batch = 512;  // rows per forward pass
};

struct perplexity_result {
  double ppl = 0;        // exp(mean negative log-likelihood)
  double ppl_error = 0;  // one standard error of ppl, from the spread of the per-token values
  double mean_nll = 0;   // nats per scored token
  int64_t scored = 0;    // tokens scored
  int64_t chunks = 0;
  std::vector<double> running;  // the estimate after each chunk
};

// tokens: the whole text, tokenized (with or without a leading BOS). bos: the id each chunk
// starts with. on_chunk, when set, is called with the running estimate after each chunk.
// Throws std::invalid_argument for n_ctx < 2 or a text shorter than one chunk.
perplexity_result perplexity(const models::model& m, std::span<const int32_t> tokens, int32_t bos, const perplexity_params& p,
                             kernels::cpu::thread_pool* pool, const std::function<void(int64_t chunk, double ppl)>& on_chunk = {});

}  // namespace tandem::runtime
