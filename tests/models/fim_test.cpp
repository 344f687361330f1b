#include "models/fim.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "models/gguf_reader.h"
#include "tests/test_support.h"

using namespace tandem;
using namespace tandem::models;

namespace {

using ids = std::vector<int32_t>;

// Loaded once per file: the large vocabularies take a moment.
tokenizer load(const std::string& name) {
  static std::map<std::string, tokenizer> cache;
  if (auto it = cache.find(name); it != cache.end()) return it->second;
  gguf_file f(test::data_path(name).string());
  return cache.emplace(name, tokenizer::from_gguf(f)).first->second;
}

tokenizer qwen() { return load("vocab/ggml-vocab-qwen2.5-coder.gguf"); }
tokenizer deepseek() { return load("vocab/ggml-vocab-deepseek-coder.gguf"); }

int32_t id_of(const tokenizer& t, std::string_view text) {
  const auto id = t.find(text);
  REQUIRE(id);
  return *id;
}

ids enc(const tokenizer& t, const std::string& text) { return t.encode(text, false, false); }

ids cat(std::initializer_list<ids> parts) {
  ids out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

ids tail(const ids& v, size_t n) { return ids(v.end() - static_cast<std::ptrdiff_t>(n), v.end()); }
ids head(const ids& v, size_t n) { return ids(v.begin(), v.begin() + static_cast<std::ptrdiff_t>(n)); }

// Roomy sizes: nothing is cut.
constexpr int64_t k_ctx = 4096, k_batch = 2048, k_predict = 128;

// A CodeLlama-like SentencePiece vocabulary: markers spelled "▁<PRE>" etc., found by text,
// BOS added and a space prefix (the defaults for "llama").
tokenizer codellama_like() {
  vocab_data d;
  d.source = "codellama-like";
  d.model = "llama";
  d.tokens = {"<unk>", "<s>", "</s>", "▁<PRE>", "▁<SUF>", "▁<MID>", "▁", "a", "b", "▁a", "▁b"};
  d.scores = {0, 0, 0, 0, 0, 0, -1, -2, -2, -1, -1};
  d.types = {2, 3, 3, 3, 3, 3, 1, 1, 1, 1, 1};
  d.ids["tokenizer.ggml.unknown_token_id"] = 0;
  d.ids[std::string(k_key_bos)] = 1;
  d.ids[std::string(k_key_eos)] = 2;
  return tokenizer::from_data(std::move(d));
}

}  // namespace

TEST_SUITE("fim") {
  TEST_CASE("markers from the GGUF keys (Qwen2.5-Coder)") {
    const auto t = qwen();
    const auto f = find_fim_tokens(t);
    CHECK(f.usable());
    CHECK(f.pre == id_of(t, "<|fim_prefix|>"));
    CHECK(f.suf == id_of(t, "<|fim_suffix|>"));
    CHECK(f.mid == id_of(t, "<|fim_middle|>"));
    CHECK(f.pad == id_of(t, "<|fim_pad|>"));
    CHECK(f.rep == id_of(t, "<|repo_name|>"));
    CHECK(f.sep == id_of(t, "<|file_sep|>"));
    CHECK(f.pre == 151659);
    CHECK(t.is_eog(f.pad));
    CHECK(t.is_eog(f.sep));
  }

  TEST_CASE("markers found by their text") {
    SUBCASE("DeepSeek-Coder: no keys, no repository tokens") {
      const auto t = deepseek();
      const auto f = find_fim_tokens(t);
      CHECK(f.usable());
      CHECK(f.pre == id_of(t, "<｜fim▁begin｜>"));
      CHECK(f.suf == id_of(t, "<｜fim▁hole｜>"));
      CHECK(f.mid == id_of(t, "<｜fim▁end｜>"));
      CHECK(f.pad == -1);
      CHECK(f.rep == -1);
      CHECK(f.sep == -1);
      // Stored as USER_DEFINED, which plain text would match; as markers they are CONTROL.
      CHECK(t.vocabulary().type(f.mid) == token_type::control);
      CHECK(t.encode("<｜fim▁end｜>", false, true) == ids{f.mid});
      CHECK(t.encode("<｜fim▁end｜>", false, false).size() > 1);
    }
    SUBCASE("StarCoder: pad but no repository tokens") {
      const auto t = load("vocab/ggml-vocab-starcoder.gguf");
      const auto f = find_fim_tokens(t);
      CHECK(f.usable());
      CHECK(f.pre == id_of(t, "<fim_prefix>"));
      CHECK(f.suf == id_of(t, "<fim_suffix>"));
      CHECK(f.mid == id_of(t, "<fim_middle>"));
      CHECK(f.pad == id_of(t, "<fim_pad>"));
      CHECK(f.rep == -1);
      CHECK(f.sep == -1);
      CHECK(t.is_eog(f.pad));  // llama.cpp stops on a FIM pad found by text too
    }
    SUBCASE("Refact: a repository name but no file separator") {
      const auto t = load("vocab/ggml-vocab-refact.gguf");
      const auto f = find_fim_tokens(t);
      CHECK(f.usable());
      CHECK(f.rep == id_of(t, "<reponame>"));
      CHECK(f.sep == -1);
    }
    SUBCASE("CodeLlama spelling with the SentencePiece space mark") {
      const auto t = codellama_like();
      const auto f = find_fim_tokens(t);
      CHECK(f.pre == 3);
      CHECK(f.suf == 4);
      CHECK(f.mid == 5);
    }
  }

  TEST_CASE("the older prefix/suffix/middle keys are read, and keys win over texts") {
    vocab_data d;
    d.source = "old-keys";
    d.model = "gpt2";
    d.pre = "gpt-2";
    d.tokens = {"a", "b", "<PRE>", "<SUF>", "<MID>", "<pre2>", "<suf2>", "<mid2>"};
    d.types = {1, 1, 3, 3, 3, 3, 3, 3};
    d.ids[std::string(k_key_old_prefix)] = 5;
    d.ids[std::string(k_key_old_suffix)] = 6;
    d.ids[std::string(k_key_old_middle)] = 7;
    SUBCASE("older keys") {
      const auto f = find_fim_tokens(tokenizer::from_data(d));
      CHECK(f.pre == 5);
      CHECK(f.suf == 6);
      CHECK(f.mid == 7);
    }
    SUBCASE("the current key wins over the older one") {
      d.ids[std::string(k_key_fim_pre)] = 2;
      CHECK(find_fim_tokens(tokenizer::from_data(d)).pre == 2);
    }
    SUBCASE("without keys, the texts") {
      d.ids.clear();
      const auto f = find_fim_tokens(tokenizer::from_data(d));
      CHECK(f.pre == 2);
      CHECK(f.suf == 3);
      CHECK(f.mid == 4);
    }
  }

  TEST_CASE("vocabularies without markers cannot build a prompt") {
    for (const char* name : {"vocab/ggml-vocab-llama-spm.gguf", "stories260K.gguf"}) {
      CAPTURE(name);
      const auto t = load(name);
      const auto f = find_fim_tokens(t);
      CHECK_FALSE(f.usable());
      CHECK_THROWS_AS(build_infill_prompt(t, f, {"a", "b", "", {}}, k_ctx, k_batch, k_predict), std::invalid_argument);
    }
    fim_tokens partial;
    partial.pre = 1;
    partial.suf = 2;
    CHECK_FALSE(partial.usable());
  }

  TEST_CASE("repository-level layout (Qwen2.5-Coder)") {
    const auto t = qwen();
    const auto f = find_fim_tokens(t);
    const infill_input in{"def f(x):\n    return ", "\n\nprint(f(2))\n", "x +", {{"a.py", "y = 1\n"}, {"b/c.py", "import a\n"}}};
    const ids got = build_infill_prompt(t, f, in, k_ctx, k_batch, k_predict);
    const ids want = cat({{f.rep},
                          enc(t, "myproject\n"),
                          {f.sep},
                          enc(t, "a.py\n"),
                          enc(t, "y = 1\n"),
                          {f.sep},
                          enc(t, "b/c.py\n"),
                          enc(t, "import a\n"),
                          {f.sep},
                          enc(t, "filename\n"),
                          {f.pre},
                          enc(t, in.prefix),
                          enc(t, in.middle),
                          {f.suf},
                          enc(t, in.suffix),
                          {f.mid}});
    CHECK(got == want);
    CHECK(enc(t, "myproject\n") == ids{2408, 4987, 198});  // anchors the layout to real ids
    CHECK(t.decode(got) ==
          "<|repo_name|>myproject\n<|file_sep|>a.py\ny = 1\n<|file_sep|>b/c.py\nimport a\n<|file_sep|>filename\n"
          "<|fim_prefix|>def f(x):\n    return x +<|fim_suffix|>\n\nprint(f(2))\n<|fim_middle|>");
  }

  TEST_CASE("snippet layout with BOS (DeepSeek-Coder)") {
    const auto t = deepseek();
    const auto f = find_fim_tokens(t);
    REQUIRE(t.add_bos());
    const infill_input in{"int main() {\n", "}\n", "  return", {{"x.h", "int x;\n"}}};
    const ids got = build_infill_prompt(t, f, in, k_ctx, k_batch, k_predict);
    const ids want = cat({enc(t, "\n\n--- snippet ---\n\n"),
                          enc(t, "int x;\n"),
                          {t.bos()},
                          {f.pre},
                          enc(t, in.prefix),
                          enc(t, in.middle),
                          {f.suf},
                          enc(t, in.suffix),
                          {f.mid}});
    CHECK(got == want);
  }

  TEST_CASE("a repository name without a file separator (Refact)") {
    const auto t = load("vocab/ggml-vocab-refact.gguf");
    const auto f = find_fim_tokens(t);
    const infill_input in{"p", "s", "", {{"a.py", "x"}}};
    const ids want =
        cat({{f.rep}, enc(t, "myproject\n"), enc(t, "\n\n--- snippet ---\n\n"), enc(t, "x"), {f.pre}, enc(t, "p"), {f.suf}, enc(t, "s"), {f.mid}});
    CHECK(build_infill_prompt(t, f, in, k_ctx, k_batch, k_predict) == want);
  }

  TEST_CASE("suffix-prefix-middle order") {
    const auto t = qwen();
    const auto f = find_fim_tokens(t);
    const infill_input in{"a = ", "\nb = 2\n", "1", {}};
    const ids got = build_infill_prompt(t, f, in, k_ctx, k_batch, k_predict, /*spm_order=*/true);
    const ids want = cat({{f.rep},
                          enc(t, "myproject\n"),
                          {f.sep},
                          enc(t, "filename\n"),
                          {f.suf},
                          enc(t, in.suffix),
                          {f.pre},
                          enc(t, in.prefix),
                          enc(t, in.middle),
                          {f.mid}});
    CHECK(got == want);

    const auto d = deepseek();
    const auto fd = find_fim_tokens(d);
    const ids got_d = build_infill_prompt(d, fd, in, k_ctx, k_batch, k_predict, true);
    CHECK(got_d == cat({{d.bos(), fd.suf}, enc(d, in.suffix), {fd.pre}, enc(d, in.prefix), enc(d, in.middle), {fd.mid}}));
  }

  TEST_CASE("truncation keeps the code nearest the cursor") {
    const auto t = qwen();
    const auto f = find_fim_tokens(t);
    std::string prefix, suffix, extra_text;
    for (int i = 0; i < 40; ++i) {
      prefix += "p" + std::to_string(i) + "();\n";
      suffix += "s" + std::to_string(i) + "();\n";
      extra_text += "e" + std::to_string(i) + "();\n";
    }
    const ids p = enc(t, prefix), s = enc(t, suffix);
    const ids m = enc(t, "x");
    REQUIRE(m.size() == 1);
    // n_batch 64: the last 48 prefix tokens, the first 16 - 2 - 1 = 13 suffix tokens.
    const int64_t n_batch = 64;
    REQUIRE(p.size() > 48);
    REQUIRE(s.size() > 13);

    SUBCASE("prefix end, suffix start, no extra when the context has no room") {
      const infill_input in{prefix, suffix, "x", {{"e.py", extra_text}}};
      // n_ctx - n_batch - 2*n_predict = 100 - 64 - 40 < 0: no extra context at all.
      const ids got = build_infill_prompt(t, f, in, 100, n_batch, 20);
      CHECK(got == cat({{f.pre}, tail(p, 48), m, {f.suf}, head(s, 13), {f.mid}}));
    }
    SUBCASE("extra keeps its end") {
      const infill_input in{"", "", "", {{"e.py", extra_text}}};
      const ids extra = cat({{f.rep}, enc(t, "myproject\n"), {f.sep}, enc(t, "e.py\n"), enc(t, extra_text), {f.sep}, enc(t, "filename\n")});
      // 200 - 64 - 2*50 = 36 extra tokens.
      const ids got = build_infill_prompt(t, f, in, 200, n_batch, 50);
      CHECK(got == cat({tail(extra, 36), {f.pre, f.suf, f.mid}}));
      // n_predict -1 (unbounded in llama.cpp) leaves n_ctx - n_batch + 2.
      CHECK(build_infill_prompt(t, f, in, 100, n_batch, -1) == cat({tail(extra, 38), {f.pre, f.suf, f.mid}}));
    }
    SUBCASE("a long middle squeezes out the suffix, never itself") {
      const std::string middle = "a b c d e f g h i j k l m n o p q r s t";
      const ids mm = enc(t, middle);
      REQUIRE(mm.size() > 14);
      const infill_input in{prefix, suffix, middle, {}};
      const ids got = build_infill_prompt(t, f, in, 0, n_batch, 0);
      CHECK(got == cat({{f.pre}, tail(p, 48), mm, {f.suf, f.mid}}));
    }
    SUBCASE("a tiny batch keeps only the markers") {
      const infill_input in{prefix, suffix, "", {{"e.py", extra_text}}};
      CHECK(build_infill_prompt(t, f, in, 0, 3, 0) == ids{f.pre, f.suf, f.mid});
      CHECK(build_infill_prompt(t, f, in, 0, -8, 0) == ids{f.pre, f.suf, f.mid});
    }
    SUBCASE("absurd sizes do not overflow") {
      const infill_input in{prefix, suffix, "", {{"e.py", extra_text}}};
      constexpr int64_t big = std::numeric_limits<int64_t>::max(), small = std::numeric_limits<int64_t>::min();
      const ids all = build_infill_prompt(t, f, in, big, 0, small);
      CHECK(all.front() == f.rep);  // all the extra context is kept
      CHECK(build_infill_prompt(t, f, in, big, big, big).size() == p.size() + s.size() + 3);
    }
  }

  TEST_CASE("marker texts in user code stay text") {
    SUBCASE("control markers (Qwen2.5-Coder)") {
      const auto t = qwen();
      const auto f = find_fim_tokens(t);
      const infill_input in{"x = '<|fim_middle|>'", "<|fim_prefix|><|endoftext|>", "<|file_sep|>", {{"<|fim_suffix|>", "<|repo_name|>"}}};
      const ids got = build_infill_prompt(t, f, in, k_ctx, k_batch, k_predict);
      CHECK(std::count(got.begin(), got.end(), f.mid) == 1);
      CHECK(std::count(got.begin(), got.end(), f.pre) == 1);
      CHECK(std::count(got.begin(), got.end(), f.suf) == 1);
      CHECK(std::count(got.begin(), got.end(), f.rep) == 1);
      CHECK(std::count(got.begin(), got.end(), f.sep) == 2);  // the chunk's and the closing one
      CHECK(std::count(got.begin(), got.end(), id_of(t, "<|endoftext|>")) == 0);
      CHECK(got.back() == f.mid);
    }
    SUBCASE("markers stored as user-defined tokens (DeepSeek-Coder)") {
      const auto t = deepseek();
      const auto f = find_fim_tokens(t);
      const infill_input in{"s = \"<｜fim▁end｜>\"", "<｜fim▁begin｜>", "<｜fim▁hole｜>", {}};
      const ids got = build_infill_prompt(t, f, in, k_ctx, k_batch, k_predict);
      CHECK(std::count(got.begin(), got.end(), f.mid) == 1);
      CHECK(std::count(got.begin(), got.end(), f.pre) == 1);
      CHECK(std::count(got.begin(), got.end(), f.suf) == 1);
      CHECK(got.back() == f.mid);
    }
  }

  TEST_CASE("empty pieces add only markers") {
    const infill_input empty{};
    const auto q = qwen();
    const auto fq = find_fim_tokens(q);
    CHECK(build_infill_prompt(q, fq, empty, k_ctx, k_batch, k_predict) ==
          cat({{fq.rep}, enc(q, "myproject\n"), {fq.sep}, enc(q, "filename\n"), {fq.pre, fq.suf, fq.mid}}));
    const auto d = deepseek();
    const auto fd = find_fim_tokens(d);
    CHECK(build_infill_prompt(d, fd, empty, k_ctx, k_batch, k_predict) == ids{d.bos(), fd.pre, fd.suf, fd.mid});
    // An extra chunk with empty text still names its file.
    const infill_input named{"", "", "", {{"a.py", ""}}};
    CHECK(build_infill_prompt(q, fq, named, k_ctx, k_batch, k_predict) ==
          cat({{fq.rep}, enc(q, "myproject\n"), {fq.sep}, enc(q, "a.py\n"), {fq.sep}, enc(q, "filename\n"), {fq.pre, fq.suf, fq.mid}}));
  }

  TEST_CASE("SentencePiece pieces each get the space prefix, as in llama.cpp") {
    // Every piece is tokenized on its own, so each non-empty one starts with "▁": the prefix
    // reads " a" (CodeLlama's own template has that space after <PRE>), but the suffix and
    // the middle gain one too, and the middle is no longer glued to the prefix.
    const auto t = codellama_like();
    const auto f = find_fim_tokens(t);
    const ids got = build_infill_prompt(t, f, {"a", "b", "b", {}}, k_ctx, k_batch, k_predict);
    CHECK(got == ids{1, f.pre, 9, 10, f.suf, 10, f.mid});  // <s> ▁<PRE> ▁a ▁b ▁<SUF> ▁b ▁<MID>
    CHECK(build_infill_prompt(t, f, {}, k_ctx, k_batch, k_predict) == ids{1, f.pre, f.suf, f.mid});
  }
}
