#include "models/forward_pass.h"

#include <stdexcept>
#include <string>

namespace tandem::models {

void lay_out_step(std::span<const int32_t> tokens, std::span<const int64_t> seqs, int64_t n_vocab, int64_t max_rows,
                  const std::function<int64_t(int64_t)>& pos_of, const std::function<void(int64_t, int64_t)>& fits, std::vector<int64_t>& last_rows,
                  int64_t* row_pos) {
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
}

void check_assume(int64_t pos, int64_t seq, int64_t cur_pos, int64_t n_ctx, int64_t capacity) {
  if (capacity < 0) throw std::invalid_argument("assume: only a paged context adopts KV blocks");
  if (cur_pos != 0) throw std::invalid_argument("assume: sequence " + std::to_string(seq) + " is not empty");
  if (pos < 0 || pos > n_ctx || capacity < pos)
    throw std::invalid_argument("assume: sequence " + std::to_string(seq) + " has no KV blocks for " + std::to_string(pos) + " positions");
}

}  // namespace tandem::models
