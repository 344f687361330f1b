// Interleaving: a request for a higher-priority model whose weights are on the device runs
// between the layers of a lower-priority model's pass, and both give what they give alone.
#include <doctest/doctest.h>

#include <thread>

#include "memory/arbiter.h"
#include "memory/cpu_backend.h"
#include "models/arbiter_residency.h"
#include "models/synth.h"
#include "runtime/engine.h"
#include "tests/runtime/engine_test_util.h"
#include "tests/test_support.h"

using namespace tandem;
using namespace std::chrono_literals;
using test::alone;
using test::collect;
using test::greedy;

namespace {

template <class F>
bool until(F pred) {
  // Polled without sleeping, so as not to miss the start of a pass.
  const auto end = std::chrono::steady_clock::now() + 30s;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > end) return false;
    std::this_thread::yield();
  }
  return true;
}

enum class setup { interleave, policy_off, high_evicted };

}  // namespace

TEST_SUITE("engine_interleave") {
  TEST_CASE("a higher-priority request runs inside a lower-priority pass, only when the policy allows and its weights are on the device") {
    // low: a synthetic model of 8 layers, on a device that holds only part of it, so each of
    // its passes streams the rest through a throttled link (about 0.3 s a pass, whatever the
    // CPU); high: the tiny test model, all on the device.
    test::scratch_dir dir;
    models::synth_options o;
    o.dim = 384;
    o.layers = 8;
    o.heads = 6;
    o.kv_heads = 2;
    o.ffn = 1024;
    o.context = 1024;
    o.vocab_path = test::data_path("stories260K.gguf").string();
    o.type = kernels::weight_type::q8_0;
    o.seed = 5;
    const auto path = (dir / "low.gguf").string();
    models::synth_model(o, path);
    const models::model lo(path);
    const models::model hi(test::data_path("stories260K-q8_0.gguf").string());
    const auto lo_tok = models::tokenizer::from_gguf(lo.file());
    const auto hi_tok = models::tokenizer::from_gguf(hi.file());

    std::vector<int32_t> lo_prompt;
    for (int i = 0; i < 200; ++i) lo_prompt.push_back(3 + (i * 37) % 500);
    const std::vector<int32_t> hi_prompt = {1, 260, 33, 410};
    const auto lo_ref = alone(lo, lo_tok, lo_prompt, 1, 1024);
    const auto hi_ref = alone(hi, hi_tok, hi_prompt, 6, 1024);

    constexpr size_t blk = 16 << 10;
    auto weights = [&](const models::model& m) { return test::weight_bytes_in_blocks(m, blk); };
    const auto kv_block = test::kv_block_bytes;
    const int32_t kv_blocks = 2 * 1024 / 16;
    const uint64_t kv_bytes = ((kv_blocks * kv_block(lo) + blk - 1) / blk + (kv_blocks * kv_block(hi) + blk - 1) / blk) * blk;
    // Both KV pools, the high model and 60% of the low one.
    const uint64_t device = kv_bytes + weights(hi) + weights(lo) * 6 / 10;
    // About 9 MB streamed per low pass at 40 MB/s.
    constexpr double k_link_gbps = 0.04;

    for (const setup how : {setup::interleave, setup::policy_off, setup::high_evicted}) {
      CAPTURE(static_cast<int>(how));
      configs::roster r;
      configs::model_entry low, high;
      low.name = "low";
      low.priority = 0;
      high.name = "high";
      high.priority = 100;
      for (auto* e : {&low, &high}) {
        e->keep_alive.forever = true;
        e->max_sequences = 2;
        e->context = 1024;
      }
      r.models = {low, high};
      r.policy.prefetch = false;
      r.policy.idle_grace = std::chrono::hours(1);  // high never gives the device to low
      r.policy.interleave = how != setup::policy_off;

      auto backend = memory::make_cpu_backend(k_link_gbps);
      memory::arbiter a(*backend, {device, uint64_t{64} << 20, blk});
      auto lo_kv = memory::kv_pool::make(a, "low", kv_blocks, 16, kv_block(lo));
      auto hi_kv = memory::kv_pool::make(a, "high", kv_blocks, 16, kv_block(hi));
      REQUIRE(lo_kv);
      REQUIRE(hi_kv);
      models::arbiter_residency lo_place(a, lo, "low"), hi_place(a, hi, "high");
      runtime::engine e({{"low", &lo, &lo_tok, 0, 2, 1024, kernels::cpu::kv_type::f16, nullptr, lo_kv.get(), &lo_place},
                         {"high", &hi, &hi_tok, 100, 2, 1024, kernels::cpu::kv_type::f16, nullptr, hi_kv.get(), &hi_place}},
                        {.threads = 1, .max_batch_tokens = 1024, .prefill_chunk = 1024, .prefix_cache = false, .roster = &r});
      // High on the device first, then low (streamed beside it).
      CHECK(collect(*e.submit({"high", hi_prompt, greedy(6)})) == hi_ref);
      CHECK(collect(*e.submit({"low", {1, 20, 30}, greedy(1)})).size() == 1);
      if (how == setup::high_evicted) {
        e.control("high", {.evict = true});
        REQUIRE(until([&] {
          for (const auto& m : a.snapshot().models)
            if (m.name == "high")
              for (const auto& seg : m.segments)
                if (seg.device != memory::residency::absent) return false;
          return true;
        }));
      }

      // The low prompt's only pass is in flight while its request shows as running (the engine
      // holds its lock from admission until the pass starts, and retires it after).
      const auto lo_h = e.submit({"low", lo_prompt, greedy(1)});
      REQUIRE(until([&] { return e.stats("low").running == 1; }));
      const auto hi_h = e.submit({"high", hi_prompt, greedy(6)});
      REQUIRE(e.stats("low").running == 1);  // submitted in the middle of that pass
      CHECK(collect(*hi_h) == hi_ref);
      CHECK(collect(*lo_h) == lo_ref);
      if (how == setup::interleave) {
        // It ran inside the low pass: its passes were interleaved, and it ended first.
        CHECK(e.stats("high").interleaved_passes > 0);
        CHECK(hi_h->finished_at() < lo_h->finished_at());
      } else {
        // Interleaving off, or the high model's weights not on the device (a load is a plan's
        // memory action, which never happens in the middle of a pass): it waited for the pass.
        CHECK(e.stats("high").interleaved_passes == 0);
        CHECK(hi_h->finished_at() > lo_h->finished_at());
      }
      CHECK(e.stats("low").interleaved_passes == 0);
      e.drain();
      CHECK(e.kv_blocks_in_use("low") == 0);
      CHECK(e.kv_blocks_in_use("high") == 0);
      a.check_integrity();
    }
  }
}
