#include "models/forward_pass.h"

#include <stdexcept>
#include <string>

namespace tandem::models {

void lay_out_step(std::span<const int32_t> tokens, std::span<const int64_t> seqs, std::span<const int64_t> logit_rows, int64_t n_vocab,
                  int64_t max_rows, int64_t max_out, const std::function<int64_t(int64_t)>& pos_of, const std::function<void(int64_t, int64_t)>& fits,
                  std::vector<int64_t>& last_rows, int64_t* row_pos) {
  if (tokens.size() != seqs.size())
    throw std::invalid_argument("step: " + std::to_string(tokens.size()) + " tokens for " + std::to_string(seqs.size()) + " sequence ids");
  const auto n = static_cast<int64_t>(tokens.size());
  if (n > max_rows) throw std::invalid_argument("step: " + std::to_string(n) + " rows, more than the " + std::to_string(max_rows) + " a pass holds");
  last_rows.clear();
  for (int64_t i = 0; i < n; ++i) {
    const int64_t s = seqs[static_cast<size_t>(i)];
    pos_of(s);  // throws for a sequence out of range
    const int32_t t = tokens[static_cast<size_t>(i)];
    if (t < 0 || t >= n_vocab)
      throw std::invalid_argument("token id " + std::to_string(t) + " is outside the vocabulary (" + std::to_string(n_vocab) + ")");
    if (i == 0 || seqs[static_cast<size_t>(i - 1)] != s)
      for (int64_t j = 0; j < i; ++j)
        if (seqs[static_cast<size_t>(j)] == s)
          throw std::invalid_argument("step: the rows of sequence " + std::to_string(s) + " are not consecutive");
    if (i + 1 == n || seqs[static_cast<size_t>(i + 1)] != s) last_rows.push_back(i);
  }
  for (size_t k = 0; k < last_rows.size(); ++k) {
    const int64_t end = last_rows[k], begin = k == 0 ? 0 : last_rows[k - 1] + 1;
    const int64_t s = seqs[static_cast<size_t>(end)];
    fits(s, pos_of(s) + (end - begin + 1));
  }
  for (int64_t i = 0, k = 0; i < n; ++i) {
    const int64_t begin = k == 0 ? 0 : last_rows[static_cast<size_t>(k - 1)] + 1;
    row_pos[i] = pos_of(seqs[static_cast<size_t>(i)]) + (i - begin);
    if (i == last_rows[static_cast<size_t>(k)]) ++k;
  }
  const auto runs = last_rows.size();
  if (logit_rows.empty()) {
    if (static_cast<int64_t>(runs) > max_out)
      throw std::invalid_argument("step: " + std::to_string(runs) + " rows of logits, more than the " + std::to_string(max_out) + " a pass gives");
    return;
  }
  if (logit_rows.size() != runs)
    throw std::invalid_argument("step: logit rows for " + std::to_string(logit_rows.size()) + " sequences, the pass has " + std::to_string(runs));
  int64_t total = 0;
  for (size_t k = 0; k < runs; ++k) {
    const int64_t len = last_rows[k] - (k == 0 ? -1 : last_rows[k - 1]);
    if (logit_rows[k] < 1 || logit_rows[k] > len)
      throw std::invalid_argument("step: " + std::to_string(logit_rows[k]) + " rows of logits for a run of " + std::to_string(len) + " rows");
    total += logit_rows[k];
  }
  if (total > max_out)
    throw std::invalid_argument("step: " + std::to_string(total) + " rows of logits, more than the " + std::to_string(max_out) + " a pass gives");
  // Each run's last rows, filled from the back: run k's last row (index k) is read before
  // anything is written at or below it.
  last_rows.resize(static_cast<size_t>(total));
  auto at = static_cast<size_t>(total);
  for (size_t k = runs; k-- > 0;) {
    const int64_t end = last_rows[k];
    for (int64_t j = 0; j < logit_rows[k]; ++j) last_rows[--at] = end - j;
  }
}

void check_assume(int64_t pos, int64_t seq, int64_t cur_pos, int64_t n_ctx, int64_t capacity) {
  if (capacity < 0) throw std::invalid_argument("assume: only a paged context adopts KV blocks");
  if (cur_pos != 0) throw std::invalid_argument("assume: sequence " + std::to_string(seq) + " is not empty");
  if (pos < 0 || pos > n_ctx || capacity < pos)
    throw std::invalid_argument("assume: sequence " + std::to_string(seq) + " has no KV blocks for " + std::to_string(pos) + " positions");
}

}  // namespace tandem::models
