// Pre-tokenization for byte-level BPE: split text into words with the regexes named by
// tokenizer.ggml.pre, before byte encoding and merges. Regexes run on PCRE2 in UTF + UCP mode
// (\p{L}, \p{N}, \s are Unicode-aware), compiled (and JIT-compiled when available) once.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tandem::models {

// What a tokenizer.ggml.pre name stands for.
struct pretokenizer_spec {
  std::string_view kind;                  // canonical family, e.g. "llama3", "qwen2", "gpt2"
  std::vector<std::string_view> regexes;  // applied in sequence, see pretokenizer::split
  bool ignore_merges = false;             // a word that is itself a token is emitted whole (Llama 3)
  bool add_bos = false;                   // default of tokenizer.ggml.add_bos_token for this family
};

class pretokenizer {
 public:
  // Spec for a tokenizer.ggml.pre value ("" means "default"); nullopt when unknown.
  static std::optional<pretokenizer_spec> find_spec(std::string_view pre_name);
  // Every accepted tokenizer.ggml.pre value, for error messages and docs.
  static std::vector<std::string_view> known_names();

  // Compiles the regexes; throws std::invalid_argument naming the pattern on a syntax error.
  explicit pretokenizer(std::span<const std::string_view> regexes);

  // Splits `text` (valid UTF-8; callers sanitize first) into pieces that cover it in order.
  // Each regex in turn splits every current piece into its matches and the text between
  // them, both kept (HF tokenizers' Split with "isolated" behaviour, as llama.cpp applies
  // its regex lists); an empty match only marks a split point. Each piece is matched as a
  // subject of its own, so ^, $ and lookarounds see the piece's ends. The views point into
  // `text`; `out` is cleared first. Safe to call from several threads at once.
  void split(std::string_view text, std::vector<std::string_view>& out) const;

 private:
  struct regex;
  std::vector<std::shared_ptr<const regex>> regexes_;
};

}  // namespace tandem::models
