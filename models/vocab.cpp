#include "models/vocab.h"

#include <algorithm>
#include <array>
#include <limits>

#include "models/gguf_reader.h"

namespace tandem::models {
namespace {

// Id keys read from metadata. Only those a tokenizer uses get a member in `vocab`, but all
// are validated so that a broken file is refused at load, not when the id is first used.
constexpr std::array<std::string_view, 18> k_id_keys = {
    k_key_bos,
    k_key_eos,
    k_key_eot,
    k_key_eom,
    k_key_unk,
    k_key_pad,
    "tokenizer.ggml.seperator_token_id",
    "tokenizer.ggml.cls_token_id",
    "tokenizer.ggml.mask_token_id",
    k_key_fim_pre,
    k_key_fim_suf,
    k_key_fim_mid,
    k_key_fim_pad,
    k_key_fim_rep,
    k_key_fim_sep,
    k_key_old_prefix,
    k_key_old_suffix,
    k_key_old_middle,
};
constexpr std::array<std::string_view, 4> k_flag_keys = {
    k_key_add_bos,
    k_key_add_eos,
    k_key_add_space_prefix,
    "tokenizer.ggml.remove_extra_whitespaces",
};

// Token texts that end a turn in common chat formats (llama.cpp's list). Converters do not
// always write eot_token_id, so the text is the only reliable signal.
constexpr std::array<std::string_view, 12> k_eog_texts = {
    "<|eot_id|>",    "<|im_end|>", "<|end|>", "<|return|>", "<|call|>",        "<end_of_turn>",
    "<|endoftext|>", "<|eom_id|>", "<EOT>",   "_<EOT>",     "<|end_of_text|>", "<end_of_utterance>",
};
// Texts llama.cpp takes for the EOT token when eot_token_id is absent.
constexpr std::array<std::string_view, 9> k_eot_texts = {
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>", "<EOT>", "_<EOT>", "<end_of_utterance>",
};

// Where each FIM token is found, in fim_role order: its key, the older key (pre, suf and mid
// only), then the token texts llama.cpp recognises, for files converted before the keys
// existed. Empty strings only pad the table.
struct fim_source {
  std::string_view key, old_key;
  std::array<std::string_view, 7> texts;
};
constexpr std::array<fim_source, k_fim_roles> k_fim_sources = {{
    {k_key_fim_pre, k_key_old_prefix, {"<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>", "<|code_prefix|>"}},
    {k_key_fim_suf, k_key_old_suffix, {"<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>", "<|code_suffix|>"}},
    {k_key_fim_mid, k_key_old_middle, {"<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>", "<|code_middle|>"}},
    {k_key_fim_pad, "", {"<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>"}},
    {k_key_fim_rep, "", {"<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"}},
    {k_key_fim_sep, "", {"<|file_sep|>"}},
}};

[[noreturn]] void fail(const vocab_data& d, std::string_view key, const std::string& what) {
  throw gguf_error(d.source + ": " + std::string(key) + ": " + what);
}

}  // namespace

vocab_data read_vocab_data(const gguf_file& f) {
  vocab_data d;
  d.source = f.path();
  auto model = f.get_string("tokenizer.ggml.model");
  if (!model) f.fail_key("tokenizer.ggml.model", "missing: the file has no tokenizer");
  d.model = std::move(*model);
  d.pre = f.get_string("tokenizer.ggml.pre").value_or("");
  auto tokens = f.get_strings("tokenizer.ggml.tokens");
  if (!tokens) f.fail_key("tokenizer.ggml.tokens", "missing");
  d.tokens = std::move(*tokens);
  if (auto s = f.get_floats("tokenizer.ggml.scores")) d.scores = std::move(*s);
  if (auto t = f.get_ints("tokenizer.ggml.token_type")) d.types = std::move(*t);
  if (auto m = f.get_strings("tokenizer.ggml.merges")) d.merges = std::move(*m);
  for (auto key : k_id_keys)
    if (auto v = f.get_int(key)) d.ids[std::string(key)] = *v;
  for (auto key : k_flag_keys)
    if (auto v = f.get_bool(key)) d.flags[std::string(key)] = *v;
  return d;
}

vocab::vocab(vocab_data d) : data_(std::move(d)) {
  const size_t n = data_.tokens.size();
  if (n == 0) fail(data_, "tokenizer.ggml.tokens", "empty token list");
  if (n > static_cast<size_t>(std::numeric_limits<int32_t>::max()))
    fail(data_, "tokenizer.ggml.tokens", std::to_string(n) + " tokens do not fit 32-bit ids");
  if (!data_.scores.empty() && data_.scores.size() != n)
    fail(data_, "tokenizer.ggml.scores", std::to_string(data_.scores.size()) + " scores for " + std::to_string(n) + " tokens");
  if (!data_.types.empty() && data_.types.size() != n)
    fail(data_, "tokenizer.ggml.token_type", std::to_string(data_.types.size()) + " types for " + std::to_string(n) + " tokens");

  types_.assign(n, token_type::normal);
  for (size_t i = 0; i < data_.types.size(); ++i) {
    const int64_t t = data_.types[i];
    if (t < 0 || t > static_cast<int64_t>(token_type::byte))
      fail(data_, "tokenizer.ggml.token_type", "token " + std::to_string(i) + " has unknown type " + std::to_string(t));
    types_[i] = t == 0 ? token_type::normal : static_cast<token_type>(t);
  }

  by_text_.reserve(n);
  for (size_t i = 0; i < n; ++i) by_text_.insert_or_assign(data_.tokens[i], static_cast<int32_t>(i));

  for (const auto& [key, value] : data_.ids) read_id(key);  // validates every stored id
  bos_ = read_id(k_key_bos);
  eos_ = read_id(k_key_eos);
  eot_ = read_id(k_key_eot);
  eom_ = read_id(k_key_eom);
  unk_ = read_id(k_key_unk);
  pad_ = read_id(k_key_pad);
  if (eot_ < 0)
    for (auto t : k_eot_texts)
      if (auto id = find(t)) {
        eot_ = *id;
        break;
      }
  if (eom_ < 0)
    if (auto id = find("<|eom_id|>")) eom_ = *id;

  for (size_t r = 0; r < k_fim_roles; ++r) {
    const fim_source& src = k_fim_sources[r];
    int32_t id = read_id(src.key);
    if (id < 0 && !src.old_key.empty()) id = read_id(src.old_key);
    for (auto t : src.texts) {
      if (id >= 0 || t.empty()) break;
      if (auto found = find(t)) id = *found;
    }
    fim_[r] = id;
    // Some vocabularies store FIM markers as USER_DEFINED (DeepSeek-Coder), which is matched
    // in plain text: a user's code containing "<｜fim▁end｜>" would then end the prefix early.
    // As CONTROL they are only matched when special tokens are parsed. llama.cpp does the
    // same for markers it finds by text; doing it for ids from keys too closes the same hole
    // in files whose converter wrote the key but left the type.
    if (id >= 0 && (types_[static_cast<size_t>(id)] == token_type::normal || types_[static_cast<size_t>(id)] == token_type::user_defined))
      types_[static_cast<size_t>(id)] = token_type::control;
  }

  // End-of-generation tokens: the ids named in metadata plus the well-known texts. The
  // texts are control tokens in practice; mark them so, as llama.cpp does, so that they are
  // parsed as special and hidden when special tokens are not rendered. A code model that
  // emits a FIM pad, repository or file separator has finished the middle.
  for (int32_t id : {eos_, eot_, eom_, fim(fim_role::pad), fim(fim_role::rep), fim(fim_role::sep)})
    if (id >= 0) eog_.push_back(id);
  for (auto t : k_eog_texts)
    if (auto id = find(t)) {
      eog_.push_back(*id);
      if (types_[static_cast<size_t>(*id)] == token_type::normal) types_[static_cast<size_t>(*id)] = token_type::control;
    }
  std::sort(eog_.begin(), eog_.end());
  eog_.erase(std::unique(eog_.begin(), eog_.end()), eog_.end());

  specials_.resize(256);
  for (size_t i = 0; i < n; ++i) {
    const auto t = types_[i];
    if ((t == token_type::control || t == token_type::unknown || t == token_type::user_defined) && !data_.tokens[i].empty())
      specials_[static_cast<uint8_t>(data_.tokens[i][0])].push_back(static_cast<int32_t>(i));
  }
  for (auto& bucket : specials_)
    std::stable_sort(bucket.begin(), bucket.end(), [this](int32_t a, int32_t b) { return text(a).size() > text(b).size(); });
}

int32_t vocab::read_id(std::string_view key) const {
  const auto it = data_.ids.find(std::string(key));
  if (it == data_.ids.end()) return -1;
  const int64_t v = it->second;
  // Converters write "no such token" as -1, or as 0xFFFFFFFF when the key is a u32.
  if (v < 0 || v == 0xFFFFFFFFll) return -1;
  if (v >= size()) fail(data_, key, "token id " + std::to_string(v) + " is outside the vocabulary of " + std::to_string(size()));
  return static_cast<int32_t>(v);
}

std::optional<int32_t> vocab::find(std::string_view text) const {
  const auto it = by_text_.find(text);
  if (it == by_text_.end()) return std::nullopt;
  return it->second;
}

std::optional<bool> vocab::flag(std::string_view key) const {
  const auto it = data_.flags.find(std::string(key));
  if (it == data_.flags.end()) return std::nullopt;
  return it->second;
}

bool vocab::is_eog(int32_t id) const { return std::binary_search(eog_.begin(), eog_.end(), id); }

std::optional<int32_t> vocab::match_special(std::string_view s, size_t pos, bool parse_special) const {
  const auto& bucket = specials_[static_cast<uint8_t>(s[pos])];
  const std::string_view rest = s.substr(pos);
  for (int32_t id : bucket) {
    if (!parse_special && type(id) != token_type::user_defined) continue;
    if (rest.starts_with(text(id))) return id;
  }
  return std::nullopt;
}

}  // namespace tandem::models
