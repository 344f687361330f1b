#include "runtime/generate.h"

#include <limits>
#include <stdexcept>

#if defined(TANDEM_HAVE_CUDA)
#include "models/cuda/gpu_forward.h"
#endif

namespace tandem::runtime {
namespace {
double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The same loop over either forward pass (CPU forward_context, CUDA gpu_forward).
template <class Ctx>
generate_stats generate_with(Ctx& ctx, const models::tokenizer& tok, std::span<const int32_t> prompt, const generate_options& opt,
                             const token_sink& sink) {
  if (prompt.empty()) throw std::invalid_argument("the prompt is empty");
  if (ctx.pos() + static_cast<int64_t>(prompt.size()) >= ctx.n_ctx())
    throw std::invalid_argument("the prompt (" + std::to_string(prompt.size()) + " tokens) does not fit the context of " +
                                std::to_string(ctx.n_ctx()) + " tokens");
  generate_stats st;
  st.prompt_tokens = static_cast<int64_t>(prompt.size());
  auto t0 = std::chrono::steady_clock::now();
  // The CPU chooses its attention kernel per row; the CUDA one is always f32 (no choice).
  if constexpr (requires { ctx.set_prompt_end(int64_t{0}, int64_t{0}); })
    ctx.set_prompt_end(0, opt.fast_attention ? std::numeric_limits<int64_t>::max() : 0);
  ctx.eval(prompt);
  st.prompt_seconds = seconds_since(t0);

  std::vector<int32_t> history(prompt.begin(), prompt.end());
  std::vector<float> logits(ctx.logits().begin(), ctx.logits().end());
  sampler smp(opt.sampling);
  models::detokenizer_stream detok(tok);
  st.stop_reason = "length";
  t0 = std::chrono::steady_clock::now();
  for (int64_t i = 0; opt.max_tokens < 0 || i < opt.max_tokens; ++i) {
    const int32_t id = smp.sample(logits, history);
    if (opt.stop_at_eog && tok.is_eog(id)) {
      st.stop_reason = "eog";
      break;
    }
    history.push_back(id);
    ++st.generated_tokens;
    if (!sink(id, detok.push(id))) {
      st.stop_reason = "callback";
      break;
    }
    if (opt.max_tokens >= 0 && i + 1 >= opt.max_tokens) break;
    if (ctx.pos() >= ctx.n_ctx()) {
      st.stop_reason = "context";
      break;
    }
    const int32_t next[1] = {id};
    ctx.eval(next);
    logits.assign(ctx.logits().begin(), ctx.logits().end());
  }
  // A sink that asked to stop gets nothing more.
  if (st.stop_reason != "callback")
    if (const auto rest = detok.flush(); !rest.empty()) sink(-1, rest);
  st.generate_seconds = seconds_since(t0);
  return st;
}

}  // namespace

generate_stats generate(models::forward_context& ctx, const models::tokenizer& tok, std::span<const int32_t> prompt,
                        const generate_options& opt, const token_sink& sink) {
  return generate_with(ctx, tok, prompt, opt, sink);
}

#if defined(TANDEM_HAVE_CUDA)
generate_stats generate(models::gpu_forward& ctx, const models::tokenizer& tok, std::span<const int32_t> prompt,
                        const generate_options& opt, const token_sink& sink) {
  return generate_with(ctx, tok, prompt, opt, sink);
}
#endif

}  // namespace tandem::runtime
