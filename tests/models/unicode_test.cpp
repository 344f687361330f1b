#include "models/unicode.h"

#include <doctest/doctest.h>

#include <set>
#include <string>

using namespace tandem::models;

TEST_SUITE("unicode") {
  TEST_CASE("decoding") {
    SUBCASE("valid sequences of every length") {
      const std::string s = "a\xC3\xA9\xE2\x82\xAC\xF0\x9F\xA6\x99";  // a é € 🦙
      auto d = utf8_decode(s, 0);
      CHECK((d.valid && d.cp == 'a' && d.len == 1));
      d = utf8_decode(s, 1);
      CHECK((d.valid && d.cp == 0xE9 && d.len == 2));
      d = utf8_decode(s, 3);
      CHECK((d.valid && d.cp == 0x20AC && d.len == 3));
      d = utf8_decode(s, 6);
      CHECK((d.valid && d.cp == 0x1F999 && d.len == 4));
    }
    SUBCASE("ill-formed input is U+FFFD over the maximal subpart") {
      for (const char* bad : {"\x80", "\xC0\xAF", "\xED\xA0\x80", "\xF4\x90\x80\x80", "\xFF"}) {
        const auto d = utf8_decode(bad, 0);
        CHECK_FALSE(d.valid);
        CHECK(d.cp == 0xFFFD);
        CHECK(d.len == 1);
      }
      // A truncated 4-byte sequence is one subpart of three bytes.
      const auto d = utf8_decode(std::string("\xF0\x9F\xA6"
                                             "a"),
                                 0);
      CHECK_FALSE(d.valid);
      CHECK(d.len == 3);
    }
  }

  TEST_CASE("encoding and sanitizing") {
    std::string s;
    utf8_append(s, 0x41);
    utf8_append(s, 0x3A9);
    utf8_append(s, 0x4E00);
    utf8_append(s, 0x1F600);
    utf8_append(s, 0xD800);  // surrogate: not a scalar value
    CHECK(s == "A\xCE\xA9\xE4\xB8\x80\xF0\x9F\x98\x80\xEF\xBF\xBD");
    CHECK(utf8_is_valid(s));
    CHECK_FALSE(utf8_is_valid("a\xC3"));
    CHECK(utf8_sanitize("ok") == "ok");
    CHECK(utf8_sanitize("a\xFF"
                        "b\xF0\x9F\xA6") ==
          "a\xEF\xBF\xBD"
          "b\xEF\xBF\xBD");
    CHECK(utf8_lead_len(0x41) == 1);
    CHECK(utf8_lead_len(0x80) == 1);
    CHECK(utf8_lead_len(0xC3) == 2);
    CHECK(utf8_lead_len(0xE2) == 3);
    CHECK(utf8_lead_len(0xF0) == 4);
  }

  TEST_CASE("complete prefix holds back only an unfinished character") {
    const std::string emoji = "\xF0\x9F\xA6\x99";
    CHECK(utf8_complete_prefix("") == 0);
    CHECK(utf8_complete_prefix("ab") == 2);
    for (size_t k = 1; k < 4; ++k) {
      std::string partial = "x";
      partial.append(emoji, 0, k);
      CHECK(utf8_complete_prefix(partial) == 1);
    }
    CHECK(utf8_complete_prefix("x" + emoji) == 5);
    // Bytes that can never complete are not held back.
    CHECK(utf8_complete_prefix("x\xFF") == 2);
    CHECK(utf8_complete_prefix("x\x80") == 2);
    CHECK(utf8_complete_prefix("x\xF0\x20") == 3);
    CHECK(utf8_complete_prefix("x\xE0\x80") == 3);  // overlong lead pair
  }

  TEST_CASE("GPT-2 byte alphabet") {
    std::set<uint32_t> seen;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cp = byte_to_unicode(static_cast<uint8_t>(b));
      seen.insert(cp);
      CHECK(unicode_to_byte(cp) == b);
      std::string enc;
      utf8_append(enc, cp);
      CHECK(byte_to_unicode_utf8(static_cast<uint8_t>(b)) == enc);
    }
    CHECK(seen.size() == 256);
    CHECK(byte_to_unicode('A') == 'A');
    CHECK(byte_to_unicode(' ') == 0x120);   // 'Ġ'
    CHECK(byte_to_unicode('\n') == 0x10A);  // 'Ċ'
    CHECK(byte_to_unicode(0xAD) == 0x143);  // soft hyphen is remapped
    CHECK(unicode_to_byte(0x4E00) == -1);
  }
}
