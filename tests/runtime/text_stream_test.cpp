// Stop strings: text that may begin one is held back, the generation's text ends before the
// first one that completes, and nothing else is lost or reordered.
#include "runtime/text_stream.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "models/gguf_reader.h"
#include "tests/test_support.h"

using namespace tandem;

namespace {

models::tokenizer load(const std::string& name) {
  models::gguf_file f(test::data_path(name).string());
  return models::tokenizer::from_gguf(f);
}

// Pushes the ids one at a time: the text released, whether it stopped, and at which id.
struct run_result {
  std::string text;
  bool stopped = false;
  size_t stopped_at = 0;
  std::vector<size_t> held;  // bytes held after each push
};

run_result run(const models::tokenizer& tok, const std::vector<int32_t>& ids, std::vector<std::string> stops) {
  runtime::text_stream s(tok, std::move(stops));
  run_result r;
  for (size_t i = 0; i < ids.size(); ++i) {
    auto st = s.push(ids[i]);
    r.text += st.text;
    r.held.push_back(s.held_bytes());
    if (st.stopped) {
      r.stopped = true;
      r.stopped_at = i;
      CHECK(s.push(ids[i]).text.empty());  // nothing after a stop
      CHECK(s.flush().empty());
      return r;
    }
  }
  r.text += s.flush();
  return r;
}

}  // namespace

TEST_SUITE("text_stream") {
  // The vocabulary adds a space prefix when encoding; a stream keeps it (it continues a prompt).
  const std::string text = " Once upon a time, there was a little girl named Lily. She liked to play.";
  const std::string source = text.substr(1);

  TEST_CASE("without stop strings every byte is released as it becomes final") {
    const auto tok = load("vocab/ggml-vocab-llama-spm.gguf");
    const auto ids = tok.encode(source, false, false);
    const auto r = run(tok, ids, {});
    CHECK(r.text == text);
    CHECK_FALSE(r.stopped);
    for (const size_t h : r.held) CHECK(h == 0);
    // Empty stop strings are ignored.
    CHECK(run(tok, ids, {""}).text == text);
  }

  TEST_CASE("the text ends before the first stop string that completes, across token boundaries") {
    const auto tok = load("vocab/ggml-vocab-llama-spm.gguf");
    const auto ids = tok.encode(source, false, false);
    for (const std::string stop : {"little girl", "girl named", "e", ".", "Lily. She", "time, th"}) {
      CAPTURE(stop);
      const auto r = run(tok, ids, {stop, "never appears"});
      CHECK(r.stopped);
      CHECK(r.text == text.substr(0, text.find(stop)));
      // It stopped at the token that completed the match, not later.
      const std::string upto = tok.decode(std::vector<int32_t>(ids.begin(), ids.begin() + static_cast<long>(r.stopped_at) + 1), true);
      CHECK(upto.find(stop) != std::string::npos);
      const std::string before = tok.decode(std::vector<int32_t>(ids.begin(), ids.begin() + static_cast<long>(r.stopped_at)), true);
      CHECK(before.find(stop) == std::string::npos);
    }
    // Of several, the one that appears first wins, whatever their order in the list.
    CHECK(run(tok, ids, {"Lily", "little"}).text == text.substr(0, text.find("little")));
  }

  TEST_CASE("a tail that may begin a stop string is held back, then released when it cannot") {
    const auto tok = load("vocab/ggml-vocab-llama-spm.gguf");
    const std::string t = " a little bit, then a lot";
    const auto ids = tok.encode(t.substr(1), false, false);
    const auto r = run(tok, ids, {"little girl", "lots"});
    CHECK_FALSE(r.stopped);
    CHECK(r.text == t);  // everything comes out, in order, by the end
    size_t most = 0;
    for (const size_t h : r.held) most = std::max(most, h);
    CHECK(most > 0);           // " little" waited for what followed
    CHECK(r.held.back() > 0);  // "lot" could still become "lots" until the flush
  }

  TEST_CASE("multi-byte characters: split over byte tokens, and inside stop strings") {
    const auto tok = load("vocab/ggml-vocab-llama-spm.gguf");
    const std::string llama = "\xF0\x9F\xA6\x99";
    const std::string t = "ab" + llama + "cd" + llama + "ef";
    const auto ids = tok.encode(t, false, false);
    CHECK(run(tok, ids, {}).text == " " + t);
    CHECK(run(tok, ids, {"d" + llama}).text == " ab" + llama + "c");
    CHECK(run(tok, ids, {llama + "e"}).text == " ab" + llama + "cd");
    // A stop string that shares only a lead byte with the text never matches mid-character.
    CHECK(run(tok, ids, {"\xF0\x9F\xA6\x98"}).text == " " + t);
  }
}
