// The API tests' server: a roster of the committed stories260K model (F32, and Q8_0 as a code
// model) and a synthetic code model with a DeepSeek-Coder vocabulary (so it has FIM tokens),
// served by the real engine and HTTP server on 127.0.0.1 with an ephemeral port.
#pragma once

#include <filesystem>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "api/http_server.h"
#include "api/router.h"
#include "api/server_context.h"
#include "configs/roster_loader.h"
#include "models/synth.h"
#include "runtime/served_roster.h"
#include "tests/test_support.h"

namespace tandem::test {

// The synthetic FIM model, written once per test process.
inline std::filesystem::path fim_model_path() {
  static scratch_dir dir;
  static std::once_flag once;
  const auto path = dir / "coder-synth.gguf";
  std::call_once(once, [&] {
    models::synth_options o;
    o.arch = "llama";
    o.dim = 64;
    o.layers = 2;
    o.heads = 4;
    o.kv_heads = 2;
    o.ffn = 128;
    o.context = 1024;
    o.vocab_path = data_path("vocab/ggml-vocab-deepseek-coder.gguf").string();
    o.type = kernels::weight_type::q8_0;
    o.seed = 7;
    o.threads = 1;
    o.name = "coder-synth";
    models::synth_model(o, path.string());
  });
  return path;
}

// Waits until pred() holds, polling: the engine applies admin changes and cancellations on
// its own thread.
template <class F>
bool eventually(F pred, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
  const auto until = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < until) {
    if (pred()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return pred();
}

struct served_fixture {
  scratch_dir dir;
  configs::roster roster;
  std::unique_ptr<runtime::served_roster> served;
  std::unique_ptr<api::server_context> ctx;
  std::unique_ptr<api::http_server> server;
  uint16_t port = 0;

  // `server_yaml`: the roster's server section (indented by two spaces per level).
  // `sequences`: max_sequences of stories (4 by default) and coder (2 by default) when > 0.
  explicit served_fixture(const std::string& server_yaml = "  limits:\n    max_tokens: 256\n", int sequences = 0,
                          std::chrono::milliseconds idle_timeout = std::chrono::seconds(30)) {
    const std::string yaml =
        "server:\n  listen: 127.0.0.1:0\n" + server_yaml +
        "devices:\n  - name: cpu0\n    backend: cpu\n    vram: 96MiB\n    host: 128MiB\n"
        "models:\n"
        "  - name: stories\n    aliases: [default]\n    path: " +
        data_path("stories260K.gguf").string() +
        "\n    priority: 10\n    keep_alive: 30m\n    preload: device\n    context: 256\n    max_sequences: " +
        std::to_string(sequences > 0 ? sequences : 4) + "\n  - name: stories-q8\n    path: " + data_path("stories260K-q8_0.gguf").string() +
        "\n    role: code\n    priority: 50\n    keep_alive: 10m\n    context: 256\n    max_sequences: 2\n"
        "  - name: coder\n    path: " +
        fim_model_path().string() +
        "\n    role: code\n    priority: 40\n    context: 512\n    max_sequences: " + std::to_string(sequences > 0 ? sequences : 2) +
        "\n"
        "policy:\n  name: tandem\n  home: stories\n";
    roster = configs::parse_roster(yaml, "test-roster.yaml", dir.path().string());
    runtime::serve_options so;
    so.threads = 2;
    served = std::make_unique<runtime::served_roster>(roster, so);
    // The preload's copies land before any test looks: on a loaded machine a model's state
    // could otherwise still read "loading" at the first check.
    for (int i = 0; i < 4000 && !served->ready(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    ctx = std::make_unique<api::server_context>(*served, roster.server);
    auto hc = api::http_config_of(roster.server);  // 127.0.0.1:0, the roster's limits
    hc.idle_timeout = idle_timeout;
    hc.admit = api::make_admission(*ctx);
    server = std::make_unique<api::http_server>(hc, api::make_router(*ctx));
    port = server->port();
  }
  ~served_fixture() {
    server->stop();
    served->executor().drain();
  }
};

}  // namespace tandem::test
