// Text <-> token ids for a GGUF model: SentencePiece-style ("llama") and byte-level BPE
// ("gpt2") vocabularies, special-token parsing, and streaming detokenization. Behaviour
// follows llama.cpp (its vocabulary test vectors pass); see docs/tokenizers.md.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "models/vocab.h"

namespace tandem::models {

class gguf_file;

// Immutable after construction; copies share the same state and every method may be called
// from several threads at once.
class tokenizer {
 public:
  // Reads tokenizer.ggml.* from the file. Throws gguf_error naming the file and key for
  // missing or malformed metadata, an unsupported tokenizer type (the message lists the
  // supported ones) or an unknown pre-tokenizer.
  static tokenizer from_gguf(const gguf_file& f);
  // Same from metadata already read (tests build vocab_data by hand).
  static tokenizer from_data(vocab_data d);

  // Token ids of `text`. add_bos puts the BOS token first (nothing when the vocabulary has
  // none). With parse_special, CONTROL (and UNKNOWN) tokens written literally in the text,
  // e.g. "<|im_start|>", become those tokens; USER_DEFINED tokens are always matched, as in
  // llama.cpp and HF tokenizers. Longest match wins at each position. SPM adds the space
  // prefix (when add_space_prefix) to the first piece of text and to text after a special
  // token. Invalid UTF-8 is not an error: SPM falls back to byte tokens, BPE sees U+FFFD.
  std::vector<int32_t> encode(std::string_view text, bool add_bos, bool parse_special) const;
  // Token ids of text that continues text tokenized before it (a speculative draft's
  // proposals, retokenized for a target with another vocabulary): no BOS, no space prefix,
  // special tokens not parsed.
  std::vector<int32_t> encode_continuation(std::string_view text) const;
  // Whether encode gives tokens whose pieces spell any valid UTF-8 text back: byte-level BPE,
  // or SPM with all 256 byte tokens (a draft whose vocabulary differs from its target's is
  // only usable when both sides can say everything the other can).
  bool encodes_any_text() const;

  // The bytes the token stands for in text: SPM U+2581 -> space and <0xNN> -> that byte;
  // BPE byte-level alphabet -> bytes. CONTROL, USER_DEFINED, UNKNOWN and UNUSED tokens are
  // their text as is. With render_special false, CONTROL, UNKNOWN and UNUSED tokens give "".
  // An id outside the vocabulary gives "".
  std::string token_to_piece(int32_t id) const { return token_to_piece(id, true); }
  std::string token_to_piece(int32_t id, bool render_special) const;

  // Concatenated pieces. When the vocabulary adds a space prefix, the one space it put in
  // front of the first token (after a leading BOS) is removed again, so that
  // decode(encode(s, add_bos, false), false) == s for valid UTF-8 s. Bytes are returned as
  // they are (possibly invalid UTF-8 if ids end mid-character; see detokenizer_stream).
  std::string decode(std::span<const int32_t> ids) const { return decode(ids, true); }
  std::string decode(std::span<const int32_t> ids, bool render_special) const;

  int32_t n_vocab() const;
  int32_t bos() const;
  int32_t eos() const;
  int32_t eot() const;
  int32_t eom() const;
  int32_t unk() const;
  int32_t pad() const;
  bool add_bos() const;           // tokenizer.ggml.add_bos_token, default per type / pre
  bool add_space_prefix() const;  // SPM only (default true)
  bool is_eog(int32_t id) const;  // eos, eot, eom, FIM pad/rep/sep, end-of-turn texts
  bool is_control(int32_t id) const;
  std::optional<int32_t> find(std::string_view token_text) const;  // exact stored text
  std::string_view type_name() const;                              // "llama" / "gpt2"
  std::string_view pre_name() const;                               // tokenizer.ggml.pre or ""
  const vocab& vocabulary() const;

  // Supported tokenizer.ggml.model values.
  static std::vector<std::string_view> supported_types();

 private:
  struct state;
  explicit tokenizer(std::shared_ptr<const state> s) : s_(std::move(s)) {}
  std::shared_ptr<const state> s_;
};

// Turns ids into text one at a time for streaming: push() returns only complete UTF-8 and
// holds back the bytes of a character split across tokens (e.g. an emoji spelled as four
// byte tokens) until the rest arrives. Bytes that can never form a character are replaced
// by U+FFFD right away. CONTROL/UNKNOWN/UNUSED tokens give no text unless render_special
// (llama.cpp's generation output hides them too). No space is stripped: a stream continues
// a prompt. The tokenizer must outlive the stream (one per request: it holds no copy).
class detokenizer_stream {
 public:
  explicit detokenizer_stream(const tokenizer& t, bool render_special = false);
  std::string push(int32_t id);
  // Whatever is held back, an incomplete sequence as U+FFFD; the stream is then empty.
  std::string flush();
  size_t pending_bytes() const { return pending_.size(); }

 private:
  const tokenizer* tok_;
  bool render_special_;
  std::string pending_;
};

}  // namespace tandem::models
