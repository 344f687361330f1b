#include "models/pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <new>
#include <stdexcept>
#include <utility>

#include "models/unicode.h"

namespace tandem::models {
namespace {

// Regexes, from the models' tokenizer.json files (as collected in llama.cpp's vocabulary
// loader). `(?i:'s|...)` is spelled with explicit case classes so that caseless matching
// cannot pick up Unicode case variants (e.g. U+017F for 's'), as llama.cpp does.
constexpr std::string_view k_gpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
// The GPT-2 regex without the final `\s+`, as llama.cpp lists it for the multi-regex
// families; text it leaves unmatched still becomes a piece, so only spelling differs.
constexpr std::string_view k_gpt2_short = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S))";
constexpr std::string_view k_llama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view k_qwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view k_seed_coder =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1}| ?[^\s\p{L}\p{N}\r\n]+|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view k_bailing =
    R"('(?:[sSdDmMtT]|[lL][lL]|[vV][eE]|[rR][eE])|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+)";
constexpr std::string_view k_tekken =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view k_gpt4o =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view k_poro = R"( ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{0964}\x{06D4}\x{060C})]+)";
// CJK unified ideographs (to U+9FA5), U+0800..U+4E00 and Hangul, as DeepSeek lists them.
constexpr std::string_view k_deepseek_cjk = R"([\x{4E00}-\x{9FA5}\x{0800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";
// DeepSeek LLM's letter class: the cased letters of many scripts (not CJK), one optional
// leading space.
constexpr std::string_view k_deepseek_letters =
    R"(\s?[A-Za-z\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA}\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF})"
    R"(\x{370}-\x{373}\x{376}\x{377}\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1}\x{3A3}-\x{3F5})"
    R"(\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5}\x{13A0}-\x{13F5}\x{13F8}-\x{13FD})"
    R"(\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF}\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15})"
    R"(\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59}\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D})"
    R"(\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE}\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB})"
    R"(\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107}\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D})"
    R"(\x{2124}\x{2126}\x{2128}\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149}\x{214E})"
    R"(\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE}\x{2CF2}\x{2CF3}\x{A640}-\x{A66D})"
    R"(\x{A680}-\x{A69B}\x{A722}-\x{A76F}\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06})"
    R"(\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F}\x{104B0}-\x{104D3}\x{104D8}-\x{104FB})"
    R"(\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2}\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)";
constexpr std::string_view k_deepseek_punct = R"(\s?[!-/:-~\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)";

struct named_spec {
  std::vector<std::string_view> names;
  pretokenizer_spec spec;
};

const std::vector<named_spec>& specs() {
  static const std::vector<named_spec> table = {
      {{"default", ""}, {"default", {R"([\p{P}\$\+<=>\^~\|]+)", k_gpt2_short, R"(\p{N}+)", R"([0-9][0-9][0-9])"}}},
      {{"llama3", "llama-v3", "llama-bpe", "falcon3", "pixtral"}, {"llama3", {k_llama3}, true, true}},
      {{"dbrx", "smaug-bpe", "chatglm-bpe"}, {"llama3-regex", {k_llama3}}},
      {{"gpt-2", "gpt2", "phi-2", "mpt", "olmo", "jais", "trillion", "jina-es", "jina-de", "jina-v1-en", "jina-v2-es", "jina-v2-de", "jina-v2-code",
        "roberta-bpe"},
       {"gpt2", {k_gpt2}}},
      {{"starcoder", "refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"}, {"starcoder", {R"(\p{N})", k_gpt2_short}}},
      {{"qwen2", "deepseek-r1-qwen", "megrez", "stablelm2", "hunyuan", "grok-2"}, {"qwen2", {k_qwen2}}},
      {{"falcon"}, {"falcon", {R"([\p{P}\$\+<=>\^~\|`]+)", k_gpt2_short, R"([0-9][0-9][0-9])"}}},
      {{"deepseek-llm"}, {"deepseek-llm", {R"([\r\n])", k_deepseek_letters, k_deepseek_punct, R"(\s+$)", k_deepseek_cjk, R"(\p{N}+)"}}},
      {{"deepseek-coder"}, {"deepseek-coder", {R"([\r\n])", R"(\s?\p{L}+)", R"(\s?\p{P}+)", k_deepseek_cjk, R"(\p{N})"}}},
      {{"deepseek-v3", "hunyuan-dense"},
       {"deepseek-v3",
        {R"(\p{N}{1,3})", R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)",
         R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
      {{"tekken"}, {"tekken", {k_tekken}, true, true}},
      {{"gpt-4o", "llama4"}, {"gpt-4o", {k_gpt4o}}},
      {{"poro-chat", "bloom", "gpt3-finnish"}, {"poro", {k_poro}}},
      {{"viking"}, {"viking", {k_poro, R"(\p{N})"}}},
      {{"seed-coder"}, {"seed-coder", {k_seed_coder}}},
      {{"bailingmoe", "llada-moe"}, {"bailingmoe", {k_bailing}}},
      {{"superbpe"}, {"superbpe", {R"(\p{N}+)", R"((?=(\d{3})+(?!\d)))"}}},
  };
  return table;
}

}  // namespace

struct pretokenizer::regex {
  pcre2_code* code = nullptr;
  std::string pattern;
  ~regex() { pcre2_code_free(code); }
};

std::optional<pretokenizer_spec> pretokenizer::find_spec(std::string_view pre_name) {
  for (const auto& s : specs())
    for (auto n : s.names)
      if (n == pre_name) return s.spec;
  return std::nullopt;
}

std::vector<std::string_view> pretokenizer::known_names() {
  std::vector<std::string_view> out;
  for (const auto& s : specs())
    for (auto n : s.names)
      if (!n.empty()) out.push_back(n);
  return out;
}

pretokenizer::pretokenizer(std::span<const std::string_view> regexes) {
  for (auto pattern : regexes) {
    auto r = std::make_shared<regex>();
    r->pattern = std::string(pattern);
    int err = 0;
    PCRE2_SIZE err_at = 0;
    // DOLLAR_ENDONLY: `$` means the end of the piece, not "before a final newline" (the
    // std::regex semantics llama.cpp's lists were written for).
    r->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP | PCRE2_DOLLAR_ENDONLY, &err, &err_at,
                            nullptr);
    if (!r->code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw std::invalid_argument("pre-tokenizer regex '" + r->pattern + "' at offset " + std::to_string(err_at) + ": " +
                                  reinterpret_cast<const char*>(msg));
    }
    // JIT is an optimisation only: when it is unavailable the interpreter matches the same.
    pcre2_jit_compile(r->code, PCRE2_JIT_COMPLETE);
    regexes_.push_back(std::move(r));
  }
}

void pretokenizer::split(std::string_view text, std::vector<std::string_view>& out) const {
  out.clear();
  if (text.empty()) return;
  out.push_back(text);
  if (regexes_.empty()) return;

  // One match data for the whole call: only the overall match (ovector pair 0) is used.
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(pcre2_match_data_create(1, nullptr), &pcre2_match_data_free);
  if (!md) throw std::bad_alloc();
  std::vector<std::string_view> next;
  for (const auto& r : regexes_) {
    next.clear();
    next.reserve(out.size() * 2);
    for (const std::string_view piece : out) {
      const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
      size_t emitted = 0;  // end of the last piece pushed
      size_t start = 0;    // where the next search begins
      uint32_t opts = 0;   // after an empty match: look for a non-empty one at the same place
      for (;;) {
        int rc = pcre2_match(r->code, subject, piece.size(), start, PCRE2_NO_UTF_CHECK | opts, md.get(), nullptr);
        if (rc == PCRE2_ERROR_JIT_STACKLIMIT)  // deep backtracking: the interpreter has no such limit
          rc = pcre2_match(r->code, subject, piece.size(), start, PCRE2_NO_UTF_CHECK | PCRE2_NO_JIT | opts, md.get(), nullptr);
        if (rc == PCRE2_ERROR_NOMATCH) {
          if (opts == 0 || start >= piece.size()) break;
          // Nothing non-empty at the empty match: step over one character and search on.
          opts = 0;
          start += utf8_lead_len(static_cast<uint8_t>(piece[start]));
          continue;
        }
        if (rc < 0) {
          PCRE2_UCHAR msg[256];
          pcre2_get_error_message(rc, msg, sizeof msg);
          throw std::runtime_error("pre-tokenizer regex '" + r->pattern + "': " + reinterpret_cast<const char*>(msg));
        }
        const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
        const size_t m0 = ov[0], m1 = ov[1];
        if (m0 > emitted) next.push_back(piece.substr(emitted, m0 - emitted));
        emitted = m0;
        if (m1 > m0) {
          next.push_back(piece.substr(m0, m1 - m0));
          emitted = start = m1;
          opts = 0;
        } else {
          // An empty match only marks a split point (e.g. a lookahead that groups digits).
          if (m0 >= piece.size()) break;
          start = m0;
          opts = PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED;
        }
      }
      if (emitted < piece.size()) next.push_back(piece.substr(emitted));
    }
    out.swap(next);
  }
}

}  // namespace tandem::models
