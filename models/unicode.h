// UTF-8 helpers shared by the tokenizers: strict decoding with U+FFFD replacement, the
// "complete prefix" test used by streaming detokenization, and GPT-2's byte-level alphabet.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tandem::models {

// One decoded code point. `len` is the number of bytes consumed (at least 1). When `valid`
// is false, `cp` is U+FFFD and `len` covers the maximal ill-formed subpart (Unicode §3.9),
// so a truncated 4-byte sequence becomes one replacement character, not three.
struct utf8_decoded {
  uint32_t cp = 0;
  uint32_t len = 0;
  bool valid = false;
};

// Strict decoding (no overlongs, surrogates or code points above U+10FFFF); pos < s.size().
utf8_decoded utf8_decode(std::string_view s, size_t pos);

// Appends the UTF-8 encoding of cp (cp must be a scalar value; others become U+FFFD).
void utf8_append(std::string& out, uint32_t cp);

// Length implied by a lead byte, as SentencePiece splits text: 1 for ASCII and for stray
// continuation bytes, 2/3/4 by the high bits. Never 0.
size_t utf8_lead_len(uint8_t lead);

bool utf8_is_valid(std::string_view s);

// s with every ill-formed subpart replaced by U+FFFD; returns s unchanged when valid.
std::string utf8_sanitize(std::string_view s);

// Length of the longest prefix of s that does not end inside a multi-byte sequence that is
// well-formed so far but incomplete. Bytes that can never become valid count as complete
// (they are replaced, not held back).
size_t utf8_complete_prefix(std::string_view s);

// GPT-2 byte-level BPE alphabet: every byte maps to one printable code point (printable
// Latin-1 bytes map to themselves, the 68 others to U+0100 upwards in byte order).
uint32_t byte_to_unicode(uint8_t b);
// UTF-8 of byte_to_unicode(b), precomputed.
std::string_view byte_to_unicode_utf8(uint8_t b);
// Inverse of byte_to_unicode; -1 for code points outside the alphabet.
int unicode_to_byte(uint32_t cp);

}  // namespace tandem::models
