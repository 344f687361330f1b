// A roster opened for serving: models found by name and alias, preloads placed, the engine
// serving them, and clear errors for what cannot be served.
#include "runtime/served_roster.h"

#include <doctest/doctest.h>

#include <fstream>
#include <random>
#include <thread>
#include <vector>

#include "configs/roster_loader.h"
#include "models/gguf_reader.h"
#include "models/gguf_writer.h"
#include "models/synth.h"
#include "tests/runtime/engine_test_util.h"
#include "tests/test_support.h"

using namespace tandem;
using namespace std::chrono_literals;

namespace {

std::string roster_yaml(const std::string& second_model_path, const std::string& devices = "") {
  return "devices:\n  - name: cpu0\n    backend: cpu\n    vram: 64MiB\n    host: 64MiB\n" + devices +
         "models:\n"
         "  - name: stories\n    aliases: [default, tiny]\n    path: " +
         test::data_path("stories260K.gguf").string() +
         "\n    preload: device\n    context: 128\n    max_sequences: 2\n"
         "  - name: second\n    path: " +
         second_model_path + "\n    chat_template: chatml\n    context: 128\n    max_sequences: 1\n";
}

}  // namespace

TEST_SUITE("served_roster") {
  TEST_CASE("models by name and alias, the preload on the device, the chat template override, and a generation") {
    const auto r = configs::parse_roster(roster_yaml(test::data_path("stories260K-q8_0.gguf").string()), "t.yaml", ".");
    runtime::served_roster s(r, {.threads = 1});
    REQUIRE(s.models().size() == 2);
    CHECK(s.find("stories") == s.models()[0].get());
    CHECK(s.find("tiny") == s.models()[0].get());
    CHECK(s.find("nope") == nullptr);
    CHECK(s.find("second")->chat.kind == models::chat_template_kind::chatml);
    CHECK(s.models()[0]->file_bytes > 0);
    // The models compute from the arbiter's copies of their segments, so they hold no copy of
    // their weights themselves (which doubled a served model's memory).
    for (const auto& m : s.models()) {
      CHECK(m->model->weights().packed.size() == 0);
      CHECK(m->model->weights().layers[0].wq.data == m->model->file().tensor("blk.0.attn_q.weight").data.data());
    }
    for (int i = 0; i < 1000 && !s.ready(); ++i) std::this_thread::sleep_for(5ms);
    CHECK(s.ready());
    bool stories_on_device = false;
    for (const auto& m : s.arbiter().snapshot().models)
      if (m.name == "stories") {
        stories_on_device = true;
        for (const auto& seg : m.segments) stories_on_device &= seg.device != memory::residency::absent;
      }
    CHECK(stories_on_device);
    runtime::generation_params p;
    p.max_tokens = 5;
    auto h = s.executor().submit({"second", {1, 403, 407}, p});
    h->wait();
    CHECK(h->finished() == runtime::finish_reason::length);
    s.executor().drain();
    s.arbiter().check_integrity();
  }

  TEST_CASE("kv_type q8_0 and q4_0 in a roster: pages of the quantized size, generations complete, q4_0 rotated unless turned off") {
    test::scratch_dir dir;
    const auto path = (dir / "s.gguf").string();
    test::write_small_synth(path, kernels::weight_type::q8_0, 0);
    const std::string yaml =
        "devices:\n  - backend: cpu\n    vram: 16MiB\n    host: 16MiB\nmodels:\n"
        "  - name: a\n    path: " +
        path +
        "\n    kv_type: q8_0\n    context: 256\n    max_sequences: 2\n"
        "  - name: b\n    path: " +
        path +
        "\n    kv_type: q4_0\n    context: 256\n    max_sequences: 2\n"
        "  - name: c\n    path: " +
        path + "\n    kv_type: q4_0\n    kv_rotate: false\n    context: 256\n    max_sequences: 2\n";
    const auto r = configs::parse_roster(yaml, "q.yaml", ".");
    CHECK(runtime::kv_rotate_of(r.models[0]) == false);
    CHECK(runtime::kv_rotate_of(r.models[1]) == true);
    CHECK(runtime::kv_rotate_of(r.models[2]) == false);
    runtime::served_roster s(r, {.threads = 1});
    auto& e = s.executor();
    // Two layers x K and V x 64 values a position: 2 blocks of 32 per row, 34 or 18 bytes each
    // (f16: 128 bytes), 16 positions a page, in whole units of the arbiter (1 KiB here: no
    // larger power of two divides both blocks).
    const uint64_t q8_block = 2 * 2 * 2 * 34 * 16, q4_block = 2 * 2 * 2 * 18 * 16;
    CHECK(e.stats("a").kv_block_bytes == (q8_block + 1023) / 1024 * 1024);
    CHECK(e.stats("b").kv_block_bytes == (q4_block + 1023) / 1024 * 1024);
    CHECK(e.stats("b").kv_block_bytes < 2 * 2 * 128 * 16 / 2);
    runtime::generation_params p;
    p.max_tokens = 20;
    p.stop_at_eog = false;
    std::vector<std::shared_ptr<runtime::request_handle>> hs;
    for (const char* name : {"a", "b", "c"}) hs.push_back(e.submit({name, {1, 403, 407, 261}, p}));
    for (auto& h : hs) {
      h->wait();
      CHECK(h->finished() == runtime::finish_reason::length);
    }
    e.drain();
    for (const char* name : {"a", "b", "c"}) CHECK(e.stats(name).kv_blocks_used == 0);
    s.arbiter().check_integrity();
  }

  TEST_CASE("a draft attached in the roster speculates under the arbiter; evicting it mid-generation changes nothing") {
    test::scratch_dir dir;
    const auto tpath = (dir / "t.gguf").string(), dpath = (dir / "d.gguf").string();
    test::write_small_synth(tpath, kernels::weight_type::q8_0, 21);
    test::write_small_synth(dpath, kernels::weight_type::q4_0, 21);
    const std::string yaml = "devices:\n  - backend: cpu\n    vram: 16MiB\n    host: 16MiB\nmodels:\n  - name: t\n    path: " + tpath +
                             "\n    context: 256\n    max_sequences: 2\n    draft: d\n    speculate: {max_tokens: 6}\n"
                             "  - name: d\n    path: " +
                             dpath + "\n    role: draft\n    context: 256\n    max_sequences: 1\n";
    const auto r = configs::parse_roster(yaml, "t.yaml", ".");
    runtime::served_roster s(r, {.threads = 2, .max_batch_tokens = 64, .prefill_chunk = 16});
    auto& e = s.executor();
    const models::model plain(tpath);
    const auto tok = models::tokenizer::from_gguf(plain.file());
    const std::vector<int32_t> prompt{1, 300, 301, 302, 303, 304, 305};
    const auto want = test::alone(plain, tok, prompt, 120);
    // Once alone, then twice at once with the draft evicted part way (it comes back when the
    // plan finds room for it again).
    CHECK(test::collect(*e.submit({"t", prompt, test::greedy(120)})) == want);
    CHECK(e.stats("t").spec_accepted > 0);
    CHECK(e.stats("t").draft == "d");
    std::vector<std::shared_ptr<runtime::request_handle>> hs;
    for (int i = 0; i < 2; ++i) hs.push_back(e.submit({"t", prompt, test::greedy(120)}));
    int32_t id = 0;
    for (int k = 0; k < 30; ++k) REQUIRE(hs[0]->next(&id, 30s));
    e.control("d", {.evict = true});
    std::vector<int32_t> first(want.begin(), want.begin() + 30);
    for (int32_t t = 0; hs[0]->next(&t, 30s);) first.push_back(t);
    CHECK(first == want);
    CHECK(test::collect(*hs[1]) == want);
    e.drain();
    // Off the device at least once: by the operator here, or by the plan before (on a busy
    // machine the measured speed-up may already have said the draft does not pay).
    CHECK(e.stats("d").swap_outs >= 1);
    CHECK(e.stats("d").kv_blocks_used == 0);
    for (const auto& m : s.models()) m->kv->check();
    s.arbiter().check_integrity();
  }

  TEST_CASE("a draft of another vocabulary that cannot spell every text is a roster error naming the line") {
    // The draft's vocabulary: stories260K's with its byte tokens made plain ones (and one token
    // renamed, so that the vocabularies differ): text it has no pieces for cannot be fed to it.
    test::scratch_dir dir;
    const auto vpath = (dir / "vocab.gguf").string(), dpath = (dir / "d.gguf").string();
    {
      const models::gguf_file stories(test::data_path("stories260K.gguf").string());
      models::gguf_writer w;
      for (const auto& kv : stories.metadata()) {
        if (kv.key.rfind("tokenizer.", 0) != 0) continue;
        if (kv.key == "tokenizer.ggml.token_type") {
          std::vector<int32_t> types(kv.value.count);
          for (uint64_t i = 0; i < kv.value.count; ++i) {
            const auto t = static_cast<int32_t>(kv.value.array_number(i));
            types[i] = t == 6 ? 1 : t;  // byte -> normal
          }
          w.set(kv.key, models::gguf_out_value::array(types));
        } else if (kv.key == "tokenizer.ggml.tokens") {
          auto tokens = kv.value.strings;
          tokens.back() = "renamed";
          w.set(kv.key, models::gguf_out_value::strings(tokens));
        } else {
          w.set(kv.key, models::gguf_out_value::from(kv.value));
        }
      }
      w.write(vpath);
    }
    models::synth_options o;
    o.dim = 32;
    o.layers = 1;
    o.heads = 2;
    o.kv_heads = 2;
    o.ffn = 64;
    o.context = 256;
    o.type = kernels::weight_type::q8_0;
    o.vocab_path = vpath;
    models::synth_model(o, dpath);
    const std::string yaml = "devices:\n  - backend: cpu\n    vram: 64MiB\n    host: 64MiB\nmodels:\n  - name: t\n    path: " +
                             test::data_path("stories260K.gguf").string() + "\n    context: 256\n    draft: d\n  - name: d\n    path: " + dpath +
                             "\n    role: draft\n    context: 256\n";
    const auto r = configs::parse_roster(yaml, "t.yaml", ".");
    CHECK_THROWS_WITH_AS(runtime::served_roster(r, {.threads = 1}),
                         doctest::Contains("t.yaml:6: model 't': draft 'd' has another vocabulary, and the tokenizer of 'd' cannot spell every text"),
                         std::runtime_error);
  }

  TEST_CASE("errors name the model and file, or the roster") {
    test::scratch_dir dir;
    { std::ofstream(dir / "junk.gguf") << "this is not a GGUF file at all, just some text"; }
    const auto bad = configs::parse_roster(roster_yaml((dir / "junk.gguf").string()), "t.yaml", ".");
    try {
      runtime::served_roster s(bad, {.threads = 1});
      FAIL("a junk model file was served");
    } catch (const std::runtime_error& e) {
      const std::string msg = e.what();
      CHECK(msg.find("model 'second'") != std::string::npos);
      CHECK(msg.find("junk.gguf") != std::string::npos);
    }
    const auto two = configs::parse_roster(
        roster_yaml(test::data_path("stories260K-q8_0.gguf").string(), "  - name: cpu1\n    backend: cpu\n    vram: 64MiB\n    host: 64MiB\n"),
        "t.yaml", ".");
    CHECK_THROWS_AS(runtime::served_roster(two, {.threads = 1}), std::invalid_argument);
  }

  TEST_CASE("a scaled office roster: KV pages come and go from one device pool, beyond what full reservations would allow") {
    // A chat model with 4 x 2048 positions and a code model with 2 x 512, whose KV reserved
    // up front (512 + 64 blocks of 10 KiB: 5.6 MiB) would not fit the 4 MiB device beside
    // their 1.5 MiB of weights. KV pages are taken as sequences grow and given back as they end.
    const std::string yaml =
        "devices:\n  - backend: cpu\n    vram: 4MiB\n    host: 64MiB\n"
        "models:\n"
        "  - name: chat\n    path: " +
        test::data_path("stories260K.gguf").string() +
        "\n    priority: 10\n    context: 2048\n    max_sequences: 4\n"
        "  - name: code\n    path: " +
        test::data_path("stories260K-q8_0.gguf").string() +
        "\n    role: code\n    priority: 50\n    preload: device\n    context: 512\n    max_sequences: 2\n"
        "    kv_reserve: 256KiB\n";
    const auto r = configs::parse_roster(yaml, "office.yaml", ".");
    runtime::served_roster s(r, {.threads = 1});
    auto& e = s.executor();
    const auto floor = e.stats("code").kv_blocks_device;
    CHECK(floor == 26);  // 256 KiB in whole pages of one 10 KiB block (16 positions) each
    CHECK(e.stats("chat").kv_blocks_device == 0);
    CHECK(e.stats("chat").kv_blocks_total == 4 * 2048 / 16);  // a limit, not a reservation
    const uint64_t page = e.stats("chat").kv_block_bytes;
    CHECK(page == 10u << 10);  // the arbiter's unit divides every model's block: no page is padded
    CHECK(static_cast<uint64_t>(e.stats("chat").kv_blocks_total + e.stats("code").kv_blocks_total) * page > s.arbiter().snapshot().device.capacity);

    runtime::generation_params longer;
    longer.max_tokens = 1900;  // most of the chat's context
    longer.stop_at_eog = false;
    runtime::generation_params shorter;
    shorter.max_tokens = 24;
    shorter.stop_at_eog = false;
    // A long chat, while the code model keeps answering.
    auto big = e.submit({"chat", {1, 403, 407, 300}, longer});
    std::vector<std::shared_ptr<runtime::request_handle>> code;
    for (int i = 0; i < 6; ++i) {
      code.push_back(e.submit({"code", {1, 261, static_cast<int32_t>(300 + i)}, shorter}));
      code.back()->wait();
      CHECK(code.back()->finished() == runtime::finish_reason::length);
    }
    int32_t most = 0;
    while (big->finished() == runtime::finish_reason::none) {
      most = std::max(most, e.stats("chat").kv_blocks_device);
      std::this_thread::sleep_for(2ms);
    }
    CHECK(big->finished() == runtime::finish_reason::length);
    CHECK(most >= 100);  // about 1904 positions in blocks of 16 at its peak
    // Three chat sessions and code requests at once: all complete.
    std::vector<std::shared_ptr<runtime::request_handle>> all;
    for (int i = 0; i < 3; ++i) all.push_back(e.submit({"chat", {1, static_cast<int32_t>(400 + i), 286}, shorter}));
    for (int i = 0; i < 4; ++i) all.push_back(e.submit({"code", {1, static_cast<int32_t>(350 + i), 287}, shorter}));
    for (auto& h : all) {
      h->wait();
      CHECK(h->finished() == runtime::finish_reason::length);
    }
    e.drain();
    // Back to what the prefix caches keep (and the code model's floor).
    for (const char* m : {"chat", "code"}) {
      CAPTURE(m);
      const auto st = e.stats(m);
      CHECK(st.kv_blocks_used == 0);
      CHECK(st.kv_blocks_device <= std::max(st.kv_blocks_cached, st.kv_blocks_floor));
    }
    s.arbiter().check_integrity();
  }

  TEST_CASE("cancelling at random points, two models sharing the device's KV pages: every page comes back") {
    const std::string yaml =
        "devices:\n  - backend: cpu\n    vram: 3MiB\n    host: 8MiB\n"
        "models:\n"
        "  - name: a\n    path: " +
        test::data_path("stories260K.gguf").string() +
        "\n    context: 256\n    max_sequences: 4\n"
        "  - name: b\n    path: " +
        test::data_path("stories260K-q8_0.gguf").string() + "\n    context: 256\n    max_sequences: 4\n    kv_reserve: 40KiB\n";
    const auto r = configs::parse_roster(yaml, "t.yaml", ".");
    runtime::served_roster s(r, {.threads = 2, .max_batch_tokens = 32, .prefill_chunk = 8});
    auto& e = s.executor();
    std::mt19937 rng(7);
    std::vector<std::shared_ptr<runtime::request_handle>> hs;
    for (int i = 0; i < 32; ++i) {
      std::vector<int32_t> p{1};
      for (int k = 0; k < 5 + static_cast<int>(rng() % 40); ++k) p.push_back(static_cast<int32_t>(10 + rng() % 400));
      runtime::generation_params g;
      g.max_tokens = 20 + static_cast<int64_t>(rng() % 100);
      g.stop_at_eog = false;
      auto h = e.submit({i % 2 ? "a" : "b", p, g});
      hs.push_back(h);
      if (rng() % 3 == 0) h->cancel();
      if (rng() % 3 == 1) {
        int32_t t = 0;
        for (int k = 0; k < static_cast<int>(rng() % 5) && h->next(&t, 10s); ++k) {
        }
        h->cancel();
      }
    }
    e.drain();
    int cancelled = 0;
    for (const auto& h : hs) {
      CHECK(h->finished() != runtime::finish_reason::none);
      CHECK(h->finished() != runtime::finish_reason::error);
      cancelled += h->finished() == runtime::finish_reason::cancelled;
    }
    CHECK(cancelled > 0);
    for (const auto& m : s.models()) {
      CAPTURE(m->name());
      const auto st = e.stats(m->name());
      CHECK(st.kv_blocks_used == 0);
      CHECK(st.kv_blocks_device <= std::max(st.kv_blocks_cached, st.kv_blocks_floor));
      m->kv->check();
    }
    CHECK(e.stats("b").kv_blocks_floor == 4);
    s.arbiter().check_integrity();
  }

  TEST_CASE("a model on the device whose sequence needs more KV pages than are free gets them from an idle model's weights") {
    // 2.6 MiB: both models' weights (1.5 MiB) leave room for about 100 pages, and the chat's
    // one sequence grows to about 120. The code model, idle, gives way.
    const std::string yaml =
        "devices:\n  - backend: cpu\n    vram: 2600KiB\n    host: 16MiB\n"
        "models:\n"
        "  - name: chat\n    path: " +
        test::data_path("stories260K.gguf").string() +
        "\n    priority: 10\n    context: 2048\n    max_sequences: 1\n    preload: device\n"
        "  - name: code\n    path: " +
        test::data_path("stories260K-q8_0.gguf").string() +
        "\n    role: code\n    priority: 50\n    preload: device\n    context: 256\n    max_sequences: 1\n"
        "policy:\n  idle_grace: 0s\n  hysteresis: 0s\n";
    const auto r = configs::parse_roster(yaml, "t.yaml", ".");
    runtime::served_roster s(r, {.threads = 1});
    auto& e = s.executor();
    runtime::generation_params g;
    g.max_tokens = 1900;
    g.stop_at_eog = false;
    auto h = e.submit({"chat", {1, 403, 407, 300}, g});
    int32_t t = 0;
    int64_t got = 0;
    while (h->next(&t, 20s)) ++got;
    CHECK(h->finished() == runtime::finish_reason::length);
    CHECK(got == 1900);
    // The code model answers again afterwards.
    runtime::generation_params small;
    small.max_tokens = 8;
    auto c = e.submit({"code", {1, 261}, small});
    while (c->next(&t, 20s)) {
    }
    CHECK(c->finished() == runtime::finish_reason::length);
    e.drain();
    s.arbiter().check_integrity();
  }

  TEST_CASE("a sequence whose KV could never fit beside its model's weights ends with an error, not a wait for ever") {
    const std::string yaml =
        "devices:\n  - backend: cpu\n    vram: 1600KiB\n    host: 16MiB\n"
        "models:\n"
        "  - name: chat\n    path: " +
        test::data_path("stories260K.gguf").string() + "\n    context: 2048\n    max_sequences: 1\n    preload: device\n";
    const auto r = configs::parse_roster(yaml, "t.yaml", ".");
    runtime::served_roster s(r, {.threads = 1});
    runtime::generation_params g;
    g.max_tokens = 1900;
    g.stop_at_eog = false;
    auto h = s.executor().submit({"chat", {1, 403, 407, 300}, g});
    int32_t t = 0;
    int64_t got = 0;
    while (h->next(&t, 20s)) ++got;
    CHECK(h->finished() == runtime::finish_reason::error);
    CHECK(h->error().find("KV pages") != std::string::npos);
    CHECK(got > 100);  // what fitted was served
    CHECK(got < 1900);
    s.executor().drain();
    CHECK(s.executor().stats("chat").kv_blocks_used == 0);
    s.arbiter().check_integrity();
  }
}
