#include "models/fim.h"

#include <algorithm>
#include <stdexcept>

namespace tandem::models {
namespace {

// Token counts may come from request fields; bounding them keeps 2*n_predict and the
// differences below from overflowing whatever a client sends. No context is this large.
constexpr int64_t k_count_bound = int64_t{1} << 40;

int64_t bounded(int64_t v, int64_t lowest) { return std::clamp(v, lowest, k_count_bound); }

// User text never becomes special tokens: code may well contain "<|fim_middle|>".
std::vector<int32_t> text_tokens(const tokenizer& t, const std::string& text) { return t.encode(text, /*add_bos=*/false, /*parse_special=*/false); }

void append(std::vector<int32_t>& out, const std::vector<int32_t>& ids) { out.insert(out.end(), ids.begin(), ids.end()); }

// How many of `n` tokens fit in `budget` (a negative budget takes none).
size_t take(size_t n, int64_t budget) { return static_cast<size_t>(std::min<int64_t>(static_cast<int64_t>(n), std::max<int64_t>(0, budget))); }

}  // namespace

fim_tokens find_fim_tokens(const tokenizer& t) {
  const vocab& v = t.vocabulary();
  return {v.fim(fim_role::pre), v.fim(fim_role::suf), v.fim(fim_role::mid), v.fim(fim_role::pad), v.fim(fim_role::rep), v.fim(fim_role::sep)};
}

std::vector<int32_t> build_infill_prompt(const tokenizer& t, const fim_tokens& f, const infill_input& in, int64_t n_ctx, int64_t n_batch,
                                         int64_t n_predict, bool spm_order) {
  if (!f.usable())
    throw std::invalid_argument(
        "model has no fill-in-the-middle tokens (needs prefix, suffix and middle markers; "
        "found pre=" +
        std::to_string(f.pre) + " suf=" + std::to_string(f.suf) + " mid=" + std::to_string(f.mid) + ")");
  // A negative batch would turn into room for extra context; any negative n_predict means
  // "no limit", which llama.cpp budgets as -1.
  n_ctx = bounded(n_ctx, 0);
  n_batch = bounded(n_batch, 0);
  n_predict = bounded(n_predict, -1);

  // The extra context goes first so that it stays in the KV cache while the prefix and
  // suffix around the cursor change between requests; "myproject" and the closing
  // "filename" are llama.cpp's placeholders, kept so that cached prompts look the same.
  std::vector<int32_t> extra;
  if (f.rep >= 0) {
    extra.push_back(f.rep);
    append(extra, text_tokens(t, "myproject\n"));
  }
  for (const auto& [name, text] : in.extra) {
    if (f.sep >= 0) {
      extra.push_back(f.sep);
      append(extra, text_tokens(t, name + "\n"));
    } else {
      append(extra, text_tokens(t, "\n\n--- snippet ---\n\n"));
    }
    append(extra, text_tokens(t, text));
  }
  if (f.sep >= 0) {
    extra.push_back(f.sep);
    append(extra, text_tokens(t, "filename\n"));
  }

  const std::vector<int32_t> prefix = text_tokens(t, in.prefix);
  const std::vector<int32_t> suffix = text_tokens(t, in.suffix);
  const std::vector<int32_t> middle = text_tokens(t, in.middle);

  // A quarter of the batch for the suffix (less the middle and two markers), three quarters
  // for the prefix: the code just before the cursor and just after it matter most, hence
  // the end of the prefix and the start of the suffix. Extra context gets what the context
  // leaves after one batch and twice the tokens to predict.
  const int64_t quarter = n_batch / 4;
  const size_t n_prefix = take(prefix.size(), 3 * quarter);
  const size_t n_suffix = take(suffix.size(), quarter - (2 + static_cast<int64_t>(middle.size())));
  const size_t n_extra = take(extra.size(), n_ctx - n_batch - 2 * n_predict);

  std::vector<int32_t> pre_part{f.pre};
  pre_part.insert(pre_part.end(), prefix.end() - static_cast<std::ptrdiff_t>(n_prefix), prefix.end());
  append(pre_part, middle);
  std::vector<int32_t> suf_part{f.suf};
  suf_part.insert(suf_part.end(), suffix.begin(), suffix.begin() + static_cast<std::ptrdiff_t>(n_suffix));

  std::vector<int32_t> out(extra.end() - static_cast<std::ptrdiff_t>(n_extra), extra.end());
  out.reserve(out.size() + 1 + pre_part.size() + suf_part.size() + 1);
  if (t.add_bos() && t.bos() >= 0) out.push_back(t.bos());
  append(out, spm_order ? suf_part : pre_part);
  append(out, spm_order ? pre_part : suf_part);
  out.push_back(f.mid);
  return out;
}

}  // namespace tandem::models
