// The same roster on different devices and budgets: in a device budget smaller than its
// weights (streamed), and on the CUDA backend, where the engine computes with the CUDA
// forward pass over the arbiter's device copies of the weights and its device-tier KV pool.
// Each gives the greedy tokens of the roster on the CPU backend with room to spare. Suites
// named "gpu*" run as their own CTest entry (runtime_gpu), which reports "skipped" (exit 77)
// where no device answers.
#include <doctest/doctest.h>

#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "configs/roster_loader.h"
#include "runtime/served_roster.h"
#include "tests/test_support.h"

#if defined(TANDEM_HAVE_CUDA)
#include "kernels/cuda/runtime.h"
#endif

using namespace tandem;

namespace {

bool device_or_skip() {
  std::string why = "built without the CUDA backend";
#if defined(TANDEM_HAVE_CUDA)
  if (kernels::cuda::device_available(&why)) return true;
#endif
  if (std::getenv("TANDEM_GPU_ENTRY")) {
    std::cerr << "SKIPPED: " << why << "\n";
    std::exit(77);
  }
  MESSAGE("skipped: " << why);
  return false;
}

std::string roster_yaml(const std::string& backend, const std::string& vram, const std::string& host) {
  return "devices:\n  - name: d0\n    backend: " + backend + "\n    vram: " + vram + "\n    host: " + host +
         "\n"
         "models:\n"
         "  - name: stories\n    path: " +
         test::data_path("stories260K.gguf").string() + "\n    preload: " + (vram == "64MiB" ? "device" : "none") +
         "\n    context: 128\n    max_sequences: 3\n"
         "  - name: q8\n    path: " +
         test::data_path("stories260K-q8_0.gguf").string() + "\n    context: 128\n    max_sequences: 2\n";
}

// Greedy tokens of three concurrent requests on each model.
std::vector<std::vector<int32_t>> serve(const std::string& backend, const std::string& vram, const std::string& host = "64MiB") {
  const auto r = configs::parse_roster(roster_yaml(backend, vram, host), "t.yaml", ".");
  runtime::served_roster s(r, {.threads = 1});
  runtime::generation_params p;
  p.max_tokens = 16;
  p.sampling.temperature = 0;
  const std::vector<std::vector<int32_t>> prompts = {{1, 403, 407}, {1, 261, 378, 432, 300}, {1, 11, 12, 13}};
  std::vector<std::shared_ptr<runtime::request_handle>> hs;
  for (const char* model : {"stories", "q8"})
    for (const auto& pr : prompts) hs.push_back(s.executor().submit({model, pr, p}));
  std::vector<std::vector<int32_t>> out;
  for (auto& h : hs) {
    std::vector<int32_t> toks;
    int32_t t = 0;
    while (h->next(&t)) toks.push_back(t);
    CHECK(h->finished() == runtime::finish_reason::length);
    out.push_back(toks);
  }
  s.executor().drain();
  s.arbiter().check_integrity();
  return out;
}

}  // namespace

TEST_SUITE("served_roster_budget") {
  TEST_CASE("the same roster in a device budget smaller than its weights gives the same greedy tokens (CPU backend)") {
    const auto want = serve("cpu", "64MiB");
    CHECK(serve("cpu", "1100KiB") == want);
    CHECK(serve("cpu", "1100KiB", "512KiB") == want);  // and a host budget smaller than the weights
  }
}

TEST_SUITE("gpu_served_roster") {
  TEST_CASE("a roster on the CUDA backend generates the CPU backend's greedy tokens, resident or streamed") {
    if (!device_or_skip()) return;
    // The F32 model computes in f32 on both devices: its greedy tokens must agree exactly. The
    // Q8_0 one differs in activation precision (both quantize them to 8 bits per 32, the CPU
    // with an f16 scale and the GPU with an f32 one; cuBLAS prompts take f16), so only its
    // first token, after the prompt, is held to the CPU's.
    auto same = [](const std::vector<std::vector<int32_t>>& got, const std::vector<std::vector<int32_t>>& want) {
      REQUIRE(got.size() == want.size());
      for (size_t i = 0; i < got.size(); ++i) {
        CAPTURE(i);
        REQUIRE(got[i].size() == want[i].size());
        if (i < got.size() / 2)
          CHECK(got[i] == want[i]);
        else
          CHECK(got[i].front() == want[i].front());
      }
    };
    const auto want = serve("cpu", "64MiB");
    same(serve("cuda", "64MiB"), want);
    // Less than the larger model's weights: its layers stream through the stream slots.
    same(serve("cuda", "1100KiB"), want);
    // A host budget too small to stage the weights: fills go through a transient buffer.
    same(serve("cuda", "1100KiB", "512KiB"), want);
  }
}
