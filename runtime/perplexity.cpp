#include "runtime/perplexity.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "models/forward.h"

namespace tandem::runtime {

perplexity_result perplexity(const models::model& m, std::span<const int32_t> tokens, int32_t bos, const perplexity_params& p,
                             kernels::cpu::thread_pool* pool, const std::function<void(int64_t, double)>& on_chunk) {
  if (p.n_ctx < 2) throw std::invalid_argument("perplexity: a chunk needs at least 2 tokens, got " + std::to_string(p.n_ctx));
  const auto n = static_cast<int64_t>(tokens.size());
  int64_t chunks = n / p.n_ctx;
  if (p.max_chunks >= 0) chunks = std::min(chunks, p.max_chunks);
  if (chunks < 1)
    throw std::invalid_argument("perplexity: the text has " + std::to_string(n) + " tokens, fewer than one chunk of " + std::to_string(p.n_ctx));
  models::forward_context ctx(m, {.n_ctx = p.n_ctx, .kv = p.kv, .kv_rotate = p.kv_rotate, .max_batch = std::min(p.max_batch, p.n_ctx)}, pool);
  const int64_t vocab = m.config().n_vocab;
  const int64_t first = p.n_ctx / 2;  // positions before it only give context
  perplexity_result r;
  double sum = 0, sum_sq = 0;
  std::vector<int32_t> chunk(static_cast<size_t>(p.n_ctx));
  for (int64_t c = 0; c < chunks; ++c) {
    std::copy_n(tokens.begin() + c * p.n_ctx, p.n_ctx, chunk.begin());
    chunk[0] = bos;
    ctx.reset(0);
    ctx.eval(chunk, true);
    const auto logits = ctx.all_logits_rows();
    for (int64_t j = first; j + 1 < p.n_ctx; ++j) {
      // -log softmax(row j)[next token], in double over the whole row.
      const float* row = logits.data() + j * vocab;
      const float mx = *std::max_element(row, row + vocab);
      double z = 0;
      for (int64_t v = 0; v < vocab; ++v) z += std::exp(static_cast<double>(row[v]) - mx);
      const double nll = std::log(z) + mx - row[chunk[static_cast<size_t>(j + 1)]];
      sum += nll;
      sum_sq += nll * nll;
      ++r.scored;
    }
    ++r.chunks;
    r.running.push_back(std::exp(sum / static_cast<double>(r.scored)));
    if (on_chunk) on_chunk(c, r.running.back());
  }
  const auto k = static_cast<double>(r.scored);
  r.mean_nll = sum / k;
  r.ppl = std::exp(r.mean_nll);
  const double var = k > 1 ? std::max(0.0, (sum_sq / k - r.mean_nll * r.mean_nll) * k / (k - 1)) : 0;
  r.ppl_error = r.ppl * std::sqrt(var / k);
  return r;
}

}  // namespace tandem::runtime
