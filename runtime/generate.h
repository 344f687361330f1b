// Single-sequence generation: prompt in one batched pass, then token-by-token decode.
// (The multi-sequence engine of the executor issue replaces this for serving.)
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "models/forward.h"
#include "models/tokenizer.h"
#include "runtime/sampler.h"

#if defined(TANDEM_HAVE_CUDA)
namespace tandem::models {
class gpu_forward;  // models/cuda/gpu_forward.h
}
#endif

namespace tandem::runtime {

struct generate_options {
  int64_t max_tokens = 128;       // < 0: until end of generation or the context is full
  sampling_params sampling;
  bool stop_at_eog = true;        // stop on EOS / EOT / end-of-turn tokens (not emitted)
  // Attention of every row by the tiled f32 kernel and SwiGLU by a vector e^x
  // (forward_context::set_prompt_end), as the engine computes them: much faster at long
  // contexts, within float noise of llama.cpp instead of equal to it. Off by default for `tandem run`, whose output is llama.cpp's to the token.
  bool fast_attention = false;
};

struct generate_stats {
  int64_t prompt_tokens = 0;
  double prompt_seconds = 0;
  int64_t generated_tokens = 0;
  double generate_seconds = 0;    // sampling + decode passes after the prompt
  std::string stop_reason;        // "length", "eog", "context", "callback"
  double prompt_tok_s() const { return prompt_seconds > 0 ? prompt_tokens / prompt_seconds : 0; }
  double generate_tok_s() const { return generate_seconds > 0 ? generated_tokens / generate_seconds : 0; }
};

// Receives each generated token and its complete UTF-8 text (may be empty while a multi-byte
// character is incomplete); a final call with id -1 carries bytes still held back at the end.
// Return false to stop.
using token_sink = std::function<bool(int32_t id, const std::string& text)>;

// Runs the prompt then samples up to max_tokens tokens, streaming them to `sink`. The context
// must be empty or hold a prefix the caller wants to continue. Throws std::invalid_argument
// for an empty prompt or one that does not fit the context.
generate_stats generate(models::forward_context& ctx, const models::tokenizer& tok, std::span<const int32_t> prompt,
                        const generate_options& opt, const token_sink& sink);
#if defined(TANDEM_HAVE_CUDA)
// The same on the CUDA forward pass (fast_attention does not apply: its attention is f32).
generate_stats generate(models::gpu_forward& ctx, const models::tokenizer& tok, std::span<const int32_t> prompt,
                        const generate_options& opt, const token_sink& sink);
#endif

}  // namespace tandem::runtime
