#include "models/unicode.h"

#include <array>

namespace tandem::models {
namespace {

constexpr uint32_t k_replacement = 0xFFFD;

bool is_cont(uint8_t b) { return (b & 0xC0) == 0x80; }

// The byte-level alphabet, built once. Bytes that GPT-2 considers printable keep their
// Latin-1 code point; the rest are numbered from U+0100 in byte order.
struct byte_alphabet {
  std::array<uint32_t, 256> cp{};
  std::array<std::string, 256> utf8;
  std::array<int16_t, 512> back{};  // code points below 512 -> byte, -1 otherwise

  byte_alphabet() {
    back.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      cp[b] = printable ? static_cast<uint32_t>(b) : next++;
      utf8_append(utf8[b], cp[b]);
      back[cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const byte_alphabet& alphabet() {
  static const byte_alphabet a;
  return a;
}

}  // namespace

utf8_decoded utf8_decode(std::string_view s, size_t pos) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data()) + pos;
  const size_t avail = s.size() - pos;
  const uint8_t b0 = p[0];
  if (b0 < 0x80) return {b0, 1, true};
  size_t need;
  uint32_t cp;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2, cp = b0 & 0x1F;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3, cp = b0 & 0x0F;
    if (b0 == 0xE0) lo = 0xA0;  // overlong
    if (b0 == 0xED) hi = 0x9F;  // surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4, cp = b0 & 0x07;
    if (b0 == 0xF0) lo = 0x90;  // overlong
    if (b0 == 0xF4) hi = 0x8F;  // above U+10FFFF
  } else {
    return {k_replacement, 1, false};
  }
  for (size_t k = 1; k < need; ++k) {
    if (k >= avail) return {k_replacement, static_cast<uint32_t>(k), false};
    const uint8_t b = p[k];
    const bool ok = k == 1 ? (b >= lo && b <= hi) : is_cont(b);
    if (!ok) return {k_replacement, static_cast<uint32_t>(k), false};
    cp = (cp << 6) | (b & 0x3F);
  }
  return {cp, static_cast<uint32_t>(need), true};
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) cp = k_replacement;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

size_t utf8_lead_len(uint8_t lead) {
  static constexpr uint8_t by_high_nibble[16] = {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 3, 4};
  return by_high_nibble[lead >> 4];
}

bool utf8_is_valid(std::string_view s) {
  for (size_t pos = 0; pos < s.size();) {
    const auto d = utf8_decode(s, pos);
    if (!d.valid) return false;
    pos += d.len;
  }
  return true;
}

std::string utf8_sanitize(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  for (size_t pos = 0; pos < s.size();) {
    const auto d = utf8_decode(s, pos);
    if (d.valid)
      out.append(s.substr(pos, d.len));
    else
      utf8_append(out, k_replacement);
    pos += d.len;
  }
  return out;
}

size_t utf8_complete_prefix(std::string_view s) {
  // Only the last three bytes can belong to an unfinished sequence: find the last lead byte
  // among them and ask whether what follows it is a proper prefix of a valid sequence.
  const size_t n = s.size();
  for (size_t back = 1; back <= 3 && back <= n; ++back) {
    const size_t pos = n - back;
    const auto b = static_cast<uint8_t>(s[pos]);
    if (is_cont(b)) continue;
    if (b < 0x80) return n;
    const auto d = utf8_decode(s, pos);
    // Incomplete means: the decoder ran out of input, having accepted every byte it saw.
    const bool incomplete = !d.valid && pos + d.len == n && utf8_lead_len(b) > back && b >= 0xC2 && b <= 0xF4;
    return incomplete ? pos : n;
  }
  return n;
}

uint32_t byte_to_unicode(uint8_t b) { return alphabet().cp[b]; }

std::string_view byte_to_unicode_utf8(uint8_t b) { return alphabet().utf8[b]; }

int unicode_to_byte(uint32_t cp) { return cp < 512 ? alphabet().back[cp] : -1; }

}  // namespace tandem::models
