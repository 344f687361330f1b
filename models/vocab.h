// A tokenizer vocabulary: token texts, scores and types, the special-token ids, and the
// lookups every tokenizer type needs. Built from GGUF metadata (read_vocab_data) or from a
// plain vocab_data (tests), and validated once: later code may trust every id it holds.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace tandem::models {

class gguf_file;

// The tokens of a fill-in-the-middle prompt: prefix, suffix and middle markers, padding,
// repository name and file separator (see models/fim.h).
enum class fim_role { pre, suf, mid, pad, rep, sep };
inline constexpr size_t k_fim_roles = 6;

// tokenizer.ggml.token_type values, numbered as in llama.cpp.
enum class token_type : int32_t {
  undefined = 0,
  normal = 1,
  unknown = 2,
  control = 3,
  user_defined = 4,
  unused = 5,
  byte = 6,
};

// Tokenizer metadata as stored, before validation. Keys are the GGUF key names so that
// every validation error can name the key it is about.
struct vocab_data {
  std::string source;                  // file path (or a label), used in error messages
  std::string model;                   // tokenizer.ggml.model: "llama", "gpt2", ...
  std::string pre;                     // tokenizer.ggml.pre, "" when absent
  std::vector<std::string> tokens;     // tokenizer.ggml.tokens
  std::vector<float> scores;           // tokenizer.ggml.scores: empty or one per token
  std::vector<int64_t> types;          // tokenizer.ggml.token_type: empty or one per token
  std::vector<std::string> merges;     // tokenizer.ggml.merges ("left right", rank = index)
  std::map<std::string, int64_t> ids;  // "tokenizer.ggml.bos_token_id" -> value as stored
  std::map<std::string, bool> flags;   // "tokenizer.ggml.add_bos_token" -> value
};

// Reads the tokenizer keys of a GGUF file. Throws gguf_error naming the file and key when a
// key is missing (model, tokens) or has the wrong type.
vocab_data read_vocab_data(const gguf_file& f);

// Keys read into vocab_data::ids / flags (full GGUF key names).
inline constexpr std::string_view k_key_bos = "tokenizer.ggml.bos_token_id";
inline constexpr std::string_view k_key_eos = "tokenizer.ggml.eos_token_id";
inline constexpr std::string_view k_key_eot = "tokenizer.ggml.eot_token_id";
inline constexpr std::string_view k_key_eom = "tokenizer.ggml.eom_token_id";
inline constexpr std::string_view k_key_unk = "tokenizer.ggml.unknown_token_id";
inline constexpr std::string_view k_key_pad = "tokenizer.ggml.padding_token_id";
inline constexpr std::string_view k_key_fim_pre = "tokenizer.ggml.fim_pre_token_id";
inline constexpr std::string_view k_key_fim_suf = "tokenizer.ggml.fim_suf_token_id";
inline constexpr std::string_view k_key_fim_mid = "tokenizer.ggml.fim_mid_token_id";
inline constexpr std::string_view k_key_fim_pad = "tokenizer.ggml.fim_pad_token_id";
inline constexpr std::string_view k_key_fim_rep = "tokenizer.ggml.fim_rep_token_id";
inline constexpr std::string_view k_key_fim_sep = "tokenizer.ggml.fim_sep_token_id";
// Older names of fim_pre / fim_suf / fim_mid that CodeLlama-era converters wrote.
inline constexpr std::string_view k_key_old_prefix = "tokenizer.ggml.prefix_token_id";
inline constexpr std::string_view k_key_old_suffix = "tokenizer.ggml.suffix_token_id";
inline constexpr std::string_view k_key_old_middle = "tokenizer.ggml.middle_token_id";
inline constexpr std::string_view k_key_add_bos = "tokenizer.ggml.add_bos_token";
inline constexpr std::string_view k_key_add_eos = "tokenizer.ggml.add_eos_token";
inline constexpr std::string_view k_key_add_space_prefix = "tokenizer.ggml.add_space_prefix";

class vocab {
 public:
  // Validates `d`: at least one token and fewer than 2^31; scores and types empty or as long
  // as tokens; types within 0..6; every id in `ids` below the token count. Ids stored as -1
  // or 0xFFFFFFFF (how converters write "none") count as absent. Throws gguf_error
  // "SOURCE: KEY: what". Merges are not checked here (the BPE tokenizer skips bad ones).
  explicit vocab(vocab_data d);

  const std::string& source() const { return data_.source; }
  const std::string& model() const { return data_.model; }
  const std::string& pre() const { return data_.pre; }
  const std::vector<std::string>& merges() const { return data_.merges; }

  int32_t size() const { return static_cast<int32_t>(data_.tokens.size()); }
  bool valid_id(int32_t id) const { return id >= 0 && id < size(); }
  // Callers pass valid ids.
  const std::string& text(int32_t id) const { return data_.tokens[static_cast<size_t>(id)]; }
  float score(int32_t id) const { return data_.scores.empty() ? 0.0f : data_.scores[static_cast<size_t>(id)]; }
  token_type type(int32_t id) const { return types_[static_cast<size_t>(id)]; }

  // Id of the token whose text is exactly `text` (the last one when texts repeat, as
  // llama.cpp); nullopt when none.
  std::optional<int32_t> find(std::string_view text) const;

  // Special ids, -1 when absent. eot and eom fall back to tokens found by their text.
  int32_t bos() const { return bos_; }
  int32_t eos() const { return eos_; }
  int32_t eot() const { return eot_; }
  int32_t eom() const { return eom_; }
  int32_t unk() const { return unk_; }
  int32_t pad() const { return pad_; }

  // Fill-in-the-middle token for `r`, -1 when absent: the fim_*_token_id key (for pre, suf
  // and mid also the older prefix/suffix/middle key), else the token whose text is one that
  // llama.cpp looks for (<|fim_prefix|>, <fim_prefix>, <｜fim▁begin｜>, ▁<PRE>, ...). FIM
  // tokens stored as NORMAL or USER_DEFINED are made CONTROL, so that user text never turns
  // into one unless special tokens are parsed.
  int32_t fim(fim_role r) const { return fim_[static_cast<size_t>(r)]; }

  // The id stored under a *_token_id key (e.g. "tokenizer.ggml.fim_pre_token_id"), -1 when
  // absent. Every stored id was validated at construction.
  int32_t id_of_key(std::string_view key) const { return read_id(key); }

  // A flag from the metadata, nullopt when the key is absent.
  std::optional<bool> flag(std::string_view key) const;

  // End of generation: eos, eot, eom, fim(pad / rep / sep), and tokens whose text is one of the
  // end-of-turn markers llama.cpp recognises (<|im_end|>, <|eot_id|>, <end_of_turn>, ...).
  bool is_eog(int32_t id) const;
  const std::vector<int32_t>& eog_ids() const { return eog_; }

  // Tokens matched literally in raw text before tokenization, longest first: USER_DEFINED
  // always, CONTROL and UNKNOWN only when `parse_special` (as llama.cpp and HF tokenizers).
  // Returns the id and length of the longest such token starting at text[pos], if any.
  std::optional<int32_t> match_special(std::string_view text, size_t pos, bool parse_special) const;

 private:
  struct string_hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  int32_t read_id(std::string_view key) const;

  vocab_data data_;
  std::vector<token_type> types_;
  std::unordered_map<std::string, int32_t, string_hash, std::equal_to<>> by_text_;
  int32_t bos_ = -1, eos_ = -1, eot_ = -1, eom_ = -1, unk_ = -1, pad_ = -1;
  std::vector<int32_t> eog_;                                      // sorted
  std::vector<std::vector<int32_t>> specials_;                    // by first byte; longest text first
  std::array<int32_t, k_fim_roles> fim_{-1, -1, -1, -1, -1, -1};  // by fim_role
};

}  // namespace tandem::models
