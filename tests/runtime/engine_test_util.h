// Helpers of the engine's tests: greedy parameters, what a request gives on its own, and the
// tokens a handle streams.
#pragma once

#include <algorithm>
#include <chrono>
#include <limits>
#include <cstdint>
#include <string>
#include <vector>

#include "models/arbiter_residency.h"
#include "models/forward.h"
#include "models/synth.h"
#include "runtime/engine.h"
#include "tests/test_support.h"

namespace tandem::test {

// A small synthetic llama (dim 128, 2 layers, 4 heads of 32 on 2 KV heads: one quantized KV
// block a head) with stories260K's vocabulary, written to `path`.
inline void write_small_synth(const std::string& path, kernels::weight_type type, uint64_t seed) {
  models::synth_options o;
  o.dim = 128;
  o.layers = 2;
  o.heads = 4;
  o.kv_heads = 2;
  o.ffn = 256;
  o.context = 512;
  o.vocab_path = data_path("stories260K.gguf").string();
  o.type = type;
  o.seed = seed;
  models::synth_model(o, path);
}

inline runtime::generation_params greedy(int64_t n) {
  runtime::generation_params p;
  p.max_tokens = n;
  p.sampling.temperature = 0;
  p.stop_at_eog = false;
  return p;
}

// What one request gives on its own, greedy: a fresh context of n_ctx positions, the prompt
// in one pass, then one token at a time, attention computed as the engine computes it. A
// reference loop for the tests (the product's one loop is the engine's).
inline std::vector<int32_t> alone(const models::model& m, const models::tokenizer&, const std::vector<int32_t>& prompt, int64_t n,
                                  int64_t n_ctx = 256, kernels::cpu::kv_type kv = kernels::cpu::kv_type::f16, bool kv_rotate = false) {
  models::forward_context ctx(m, {.n_ctx = n_ctx, .kv = kv, .kv_rotate = kv_rotate}, nullptr);
  ctx.set_prompt_end(0, std::numeric_limits<int64_t>::max());
  ctx.eval(prompt);
  std::vector<int32_t> out;
  for (int64_t i = 0; i < n; ++i) {
    const auto logits = ctx.logits();
    const auto id = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    out.push_back(id);
    if (i + 1 == n || ctx.pos(0) >= n_ctx) break;
    const int32_t next[1] = {id};
    ctx.eval(next);
  }
  return out;
}

inline std::vector<int32_t> collect(runtime::request_handle& h) {
  std::vector<int32_t> out;
  int32_t t = 0;
  while (h.next(&t, std::chrono::seconds(60))) out.push_back(t);
  return out;
}

// Device bytes of a model's weight segments in an arbiter of `block` bytes, and one f16 KV
// block of 16 positions: for sizing device budgets in tests.
inline uint64_t weight_bytes_in_blocks(const models::model& m, size_t block) {
  uint64_t b = 0;
  for (const auto& seg : models::segment_sources(m)) b += (seg.bytes + block - 1) / block * block;
  return b;
}
inline size_t kv_block_bytes(const models::model& m) {
  return static_cast<size_t>(models::kv_bytes_per_token(m.config(), kernels::cpu::kv_type::f16) * 16);
}

}  // namespace tandem::test
