#include "models/tokenizer.h"

#include <optional>
#include <stdexcept>

#include "models/gguf_reader.h"
#include "models/pretokenizer.h"
#include "models/tokenizer_bpe.h"
#include "models/tokenizer_spm.h"
#include "models/unicode.h"

namespace tandem::models {

// Everything a tokenizer needs, built once and shared by copies. The SPM / BPE parts hold
// a reference to `vocab`, so the state is never copied or moved after construction.
struct tokenizer::state {
  enum class kind { spm, bpe };

  explicit state(vocab_data d) : voc(std::move(d)) {}
  state(const state&) = delete;
  state& operator=(const state&) = delete;

  vocab voc;
  kind type = kind::spm;
  bool add_bos = false;
  bool add_space_prefix = false;
  std::optional<spm_tokenizer> spm;
  std::optional<bpe_tokenizer> bpe;
  std::optional<pretokenizer> pre;

  // One run of text between special tokens. `after_special` is true for the first run and
  // for runs that follow a special token (where SPM adds its space prefix).
  void encode_text(std::string_view text, bool after_special, std::vector<int32_t>& out) const {
    if (type == kind::spm) {
      std::string escaped = add_space_prefix && after_special ? std::string(" ") : std::string();
      escaped += text;
      spm->encode(spm_escape_whitespace(escaped), out);
      return;
    }
    // PCRE2 in UTF mode needs valid UTF-8; llama.cpp also reads invalid bytes as U+FFFD.
    const bool valid = utf8_is_valid(text);
    const std::string sanitized = valid ? std::string() : utf8_sanitize(text);
    const std::string_view clean = valid ? text : std::string_view(sanitized);
    std::vector<std::string_view> words;
    pre->split(clean, words);
    for (auto w : words) bpe->encode_word(w, out);
  }

  // Special tokens first: scan left to right, longest special token at each position; the
  // text between them is tokenized normally, with SPM's space prefix (when `space_prefix`)
  // on the first run and on runs after a special token.
  void encode_runs(std::string_view text, bool parse_special, bool space_prefix, std::vector<int32_t>& out) const {
    bool after_special = space_prefix;
    size_t run_start = 0;
    for (size_t pos = 0; pos < text.size();) {
      const auto id = voc.match_special(text, pos, parse_special);
      if (!id) {
        ++pos;
        continue;
      }
      if (pos > run_start) encode_text(text.substr(run_start, pos - run_start), after_special, out);
      out.push_back(*id);
      after_special = space_prefix;
      pos += voc.text(*id).size();
      run_start = pos;
    }
    if (run_start < text.size()) encode_text(text.substr(run_start), after_special, out);
  }
};

namespace {

[[noreturn]] void fail(const vocab& v, std::string_view key, const std::string& what) {
  throw gguf_error(v.source() + ": " + std::string(key) + ": " + what);
}

// "<0xNN>" -> NN, -1 for any other text.
int parse_byte_token(std::string_view t) {
  if (t.size() != 6 || !t.starts_with("<0x") || t.back() != '>') return -1;
  int value = 0;
  for (char c : t.substr(3, 2)) {
    int digit;
    if (c >= '0' && c <= '9')
      digit = c - '0';
    else if (c >= 'A' && c <= 'F')
      digit = c - 'A' + 10;
    else if (c >= 'a' && c <= 'f')
      digit = c - 'a' + 10;
    else
      return -1;
    value = value * 16 + digit;
  }
  return value;
}

std::string join(const std::vector<std::string_view>& names) {
  std::string out;
  for (auto n : names) out += (out.empty() ? "" : ", ") + std::string(n);
  return out;
}

}  // namespace

std::vector<std::string_view> tokenizer::supported_types() { return {"llama", "gpt2"}; }

tokenizer tokenizer::from_gguf(const gguf_file& f) { return from_data(read_vocab_data(f)); }

tokenizer tokenizer::from_data(vocab_data d) {
  auto s = std::make_shared<state>(std::move(d));
  const vocab& v = s->voc;
  if (v.model() == "llama") {
    s->type = state::kind::spm;
    s->add_bos = true;
    s->add_space_prefix = true;
    s->spm.emplace(v);
  } else if (v.model() == "gpt2") {
    s->type = state::kind::bpe;
    auto spec = pretokenizer::find_spec(v.pre());
    if (!spec) fail(v, "tokenizer.ggml.pre", "unknown pre-tokenizer '" + v.pre() + "' (supported: " + join(pretokenizer::known_names()) + ")");
    s->add_bos = spec->add_bos;
    s->pre.emplace(spec->regexes);
    s->bpe.emplace(v, spec->ignore_merges);
  } else {
    fail(v, "tokenizer.ggml.model", "unsupported tokenizer type '" + v.model() + "' (supported: " + join(supported_types()) + ")");
  }
  if (auto b = v.flag(k_key_add_bos)) s->add_bos = *b;
  if (auto b = v.flag(k_key_add_space_prefix)) s->add_space_prefix = *b;
  if (s->add_bos && v.bos() < 0) s->add_bos = false;  // nothing to add
  return tokenizer(std::move(s));
}

std::vector<int32_t> tokenizer::encode(std::string_view text, bool add_bos, bool parse_special) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 2);
  if (add_bos && s_->voc.bos() >= 0) out.push_back(s_->voc.bos());
  s_->encode_runs(text, parse_special, true, out);
  return out;
}

std::vector<int32_t> tokenizer::encode_continuation(std::string_view text) const {
  std::vector<int32_t> out;
  out.reserve(text.size() / 3 + 1);
  s_->encode_runs(text, false, false, out);  // runs continue the text: no space prefix
  return out;
}

bool tokenizer::encodes_any_text() const {
  if (s_->type != state::kind::spm) return true;
  std::vector<bool> seen(256, false);
  int n = 0;
  for (int32_t id = 0; id < s_->voc.size(); ++id) {
    if (s_->voc.type(id) != token_type::byte) continue;
    const int b = parse_byte_token(s_->voc.text(id));
    if (b >= 0 && !seen[static_cast<size_t>(b)]) {
      seen[static_cast<size_t>(b)] = true;
      ++n;
    }
  }
  return n == 256;
}

std::string tokenizer::token_to_piece(int32_t id, bool render_special) const {
  const vocab& v = s_->voc;
  if (!v.valid_id(id)) return {};
  const std::string& t = v.text(id);
  switch (v.type(id)) {
    case token_type::control:
    case token_type::unknown:
    case token_type::unused:
      return render_special ? t : std::string();
    case token_type::user_defined:
      return t;  // added tokens are stored as plain text, not in the byte-level alphabet
    case token_type::byte:
      if (const int b = parse_byte_token(t); b >= 0) return std::string(1, static_cast<char>(b));
      break;
    default:
      break;
  }
  if (s_->type == state::kind::bpe) return byte_decode(t);
  return spm_unescape_whitespace(t);
}

std::string tokenizer::decode(std::span<const int32_t> ids, bool render_special) const {
  std::string out;
  size_t first = 0;
  if (!ids.empty() && ids[0] == bos() && bos() >= 0) {
    out += token_to_piece(ids[0], render_special);
    first = 1;
  }
  for (size_t k = first; k < ids.size(); ++k) {
    std::string piece = token_to_piece(ids[k], render_special);
    // Undo the space prefix encode() put in front of the text.
    if (k == first && s_->add_space_prefix && !piece.empty() && piece[0] == ' ') piece.erase(0, 1);
    out += piece;
  }
  return out;
}

int32_t tokenizer::n_vocab() const { return s_->voc.size(); }
int32_t tokenizer::bos() const { return s_->voc.bos(); }
int32_t tokenizer::eos() const { return s_->voc.eos(); }
int32_t tokenizer::eot() const { return s_->voc.eot(); }
int32_t tokenizer::eom() const { return s_->voc.eom(); }
int32_t tokenizer::unk() const { return s_->voc.unk(); }
int32_t tokenizer::pad() const { return s_->voc.pad(); }
bool tokenizer::add_bos() const { return s_->add_bos; }
bool tokenizer::add_space_prefix() const { return s_->add_space_prefix; }
bool tokenizer::is_eog(int32_t id) const { return s_->voc.is_eog(id); }
bool tokenizer::is_control(int32_t id) const { return s_->voc.valid_id(id) && s_->voc.type(id) == token_type::control; }
std::optional<int32_t> tokenizer::find(std::string_view token_text) const { return s_->voc.find(token_text); }
std::string_view tokenizer::type_name() const { return s_->voc.model(); }
std::string_view tokenizer::pre_name() const { return s_->voc.pre(); }
const vocab& tokenizer::vocabulary() const { return s_->voc; }

}  // namespace tandem::models
