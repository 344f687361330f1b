// A roster opened for serving: models found by name and alias, preloads placed, the engine
// serving them, and clear errors for what cannot be served.
#include "runtime/served_roster.h"

#include <doctest/doctest.h>

#include <fstream>
#include <thread>

#include "configs/roster_loader.h"
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
}
