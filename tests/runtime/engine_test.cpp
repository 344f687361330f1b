// The engine: concurrent requests give what each gives alone, cancellation frees the KV, and
// two models share one engine by priority.
#include "runtime/engine.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <random>
#include <thread>

#include "memory/arbiter.h"
#include "memory/cpu_backend.h"
#include "models/arbiter_residency.h"
#include "models/synth.h"
#include "tests/runtime/engine_test_util.h"
#include "tests/test_support.h"

using namespace tandem;
using namespace std::chrono_literals;
using test::alone;
using test::collect;
using test::greedy;

TEST_SUITE("engine") {
  TEST_CASE("8 concurrent requests, arriving at different times, give what each gives alone") {
    test::scratch_dir dir;
    const auto synth = (dir / "s.gguf").string();
    test::write_small_synth(synth, kernels::weight_type::q4_0, 11);
    for (const std::string& path : {test::data_path("stories260K.gguf").string(), synth}) {
      CAPTURE(path);
      const models::model m(path);
      const auto tok = models::tokenizer::from_gguf(m.file());
      runtime::engine e({{"m", &m, &tok, 0, 8, 256}}, {.threads = 2, .max_batch_tokens = 64, .prefill_chunk = 16});
      std::mt19937 rng(5);
      std::vector<std::vector<int32_t>> prompts;
      std::vector<int64_t> lengths;
      for (int i = 0; i < 8; ++i) {
        std::vector<int32_t> p{1};
        for (int k = 0; k < 3 + 9 * i; ++k) p.push_back(static_cast<int32_t>(10 + rng() % 400));
        prompts.push_back(p);
        lengths.push_back(10 + 5 * i);
      }
      std::vector<std::shared_ptr<runtime::request_handle>> hs;
      for (int i = 0; i < 8; ++i) {
        hs.push_back(e.submit({"m", prompts[static_cast<size_t>(i)], greedy(lengths[static_cast<size_t>(i)])}));
        if (i % 3 == 0) std::this_thread::sleep_for(5ms);  // later arrivals join a running batch
      }
      for (int i = 0; i < 8; ++i) {
        CAPTURE(i);
        const auto got = collect(*hs[static_cast<size_t>(i)]);
        CHECK(hs[static_cast<size_t>(i)]->finished() == runtime::finish_reason::length);
        CHECK(got == alone(m, tok, prompts[static_cast<size_t>(i)], lengths[static_cast<size_t>(i)]));
      }
      e.drain();
      CHECK(e.kv_blocks_in_use("m") == 0);
    }
  }

  TEST_CASE("a burst of short prompts joins decoding streams at once, whatever the ITL budget") {
    // An ITL budget of 1.0001 and no target hold a long prompt to one row a pass beside decoding streams
    // (four while the costs are unknown). Prompts of one chunk go in whole instead: eight of
    // 16 tokens finish within a pass or two of their submission, where 128 prompt rows at one
    // (or four) a pass would take dozens. Passes are counted by the streams' tokens (one per
    // pass each), which the engine stamps on its own thread, so the count does not depend on
    // how fast this thread runs.
    const models::model m(test::data_path("stories260K.gguf").string());
    const auto tok = models::tokenizer::from_gguf(m.file());
    runtime::engine e({{"m", &m, &tok, 0, 12, 256}},
                      {.threads = 2, .max_batch_tokens = 256, .prefill_chunk = 16, .itl_budget = 1.0001, .itl_target = {}});
    std::vector<std::shared_ptr<runtime::request_handle>> streams, burst;
    for (int i = 0; i < 4; ++i) streams.push_back(e.submit({"m", {1, static_cast<int32_t>(40 + i), 70, 80}, greedy(200)}));
    std::vector<std::vector<runtime::piece>> got(streams.size());
    for (size_t i = 0; i < streams.size(); ++i) {
      runtime::piece p;
      for (int k = 0; k < 5; ++k) {  // every stream is decoding
        REQUIRE(streams[i]->next(&p, 60s));
        got[i].push_back(p);
      }
    }
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 8; ++i) {
      std::vector<int32_t> p{1};
      for (int k = 1; k < 16; ++k) p.push_back(static_cast<int32_t>(100 + (i * 29 + k * 7) % 400));
      prompts.push_back(p);
      burst.push_back(e.submit({"m", p, greedy(1)}));
    }
    const auto submitted = std::chrono::steady_clock::now();
    for (size_t i = 0; i < burst.size(); ++i) CHECK(collect(*burst[i]) == alone(m, tok, prompts[i], 1));
    auto last = burst.front()->finished_at();
    for (auto& b : burst) last = std::max(last, b->finished_at());
    for (size_t i = 0; i < streams.size(); ++i) {
      CAPTURE(i);
      runtime::piece p;
      while (streams[i]->next(&p, 60s)) got[i].push_back(p);
      CHECK(streams[i]->finished() == runtime::finish_reason::length);
      // Passes between the last submission and the burst's end: this one's tokens released
      // in that window (a pass that ends the burst may release its token just before).
      const auto passes =
          std::count_if(got[i].begin(), got[i].end(), [&](const runtime::piece& x) { return x.token >= 0 && x.at > submitted && x.at <= last; });
      CHECK(passes <= 3);
      // The window means something only if this stream was still decoding after the burst (a
      // slow test thread could submit it after the streams ended).
      const bool decoding_after = std::any_of(got[i].begin(), got[i].end(), [&](const runtime::piece& x) { return x.token >= 0 && x.at > last; });
      if (!decoding_after) MESSAGE("stream " << i << " ended before the burst did: nothing measured");
    }
    e.drain();
    CHECK(e.kv_blocks_in_use("m") == 0);
  }

  TEST_CASE("a KV pool too small for every sequence: preemption, and still what each gives alone") {
    const models::model m(test::data_path("stories260K.gguf").string());
    const auto tok = models::tokenizer::from_gguf(m.file());
    const auto block = static_cast<size_t>(models::kv_bytes_per_token(m.config(), kernels::cpu::kv_type::f16) * 16);
    std::mt19937 rng(9);
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 6; ++i) {
      std::vector<int32_t> p{1};
      for (int k = 0; k < 20 + 7 * i; ++k) p.push_back(static_cast<int32_t>(10 + rng() % 400));
      prompts.push_back(p);
    }
    // With a host tier, preempted sequences are swapped out; without one, evaluated again.
    for (const bool host : {true, false}) {
      CAPTURE(host);
      auto backend = memory::make_cpu_backend();
      memory::arbiter a(*backend, {64 << 20, host ? uint64_t{64} << 20 : 0});
      auto pool = memory::kv_pool::make(a, "m", 12, 16, block);  // 192 positions for ~6 x 90
      REQUIRE(pool);
      runtime::engine e({{"m", &m, &tok, 0, 6, 128, kernels::cpu::kv_type::f16, nullptr, pool.get()}},
                        {.threads = 2, .max_batch_tokens = 64, .prefill_chunk = 16});
      std::vector<std::shared_ptr<runtime::request_handle>> hs;
      for (const auto& p : prompts) hs.push_back(e.submit({"m", p, greedy(50)}));
      for (size_t i = 0; i < hs.size(); ++i) {
        CAPTURE(i);
        CHECK(collect(*hs[i]) == alone(m, tok, prompts[i], 50));
      }
      e.drain();
      CHECK(e.preemptions() > 0);
      CHECK(e.kv_blocks_in_use("m") == 0);
      pool->check();
      a.check_integrity();
      // Nothing swapped out is left behind; the host holds only blocks the prefix cache spilled.
      for (const auto& o : a.snapshot().owners)
        if (o.host > 0) CHECK(o.who.part == "prefix");
    }
  }

  TEST_CASE("a q8_0 or rotated q4_0 KV pool: preempted, swapped and resumed, still what each gives alone") {
    test::scratch_dir dir;
    const auto path = (dir / "s.gguf").string();
    test::write_small_synth(path, kernels::weight_type::q4_0, 12);
    const models::model m(path);
    const auto tok = models::tokenizer::from_gguf(m.file());
    std::mt19937 rng(10);
    std::vector<std::vector<int32_t>> prompts;
    for (int i = 0; i < 6; ++i) {
      std::vector<int32_t> p{1};
      for (int k = 0; k < 20 + 7 * i; ++k) p.push_back(static_cast<int32_t>(10 + rng() % 400));
      prompts.push_back(p);
    }
    for (const auto& [kv, rotate] : {std::pair{kernels::cpu::kv_type::q8_0, false}, std::pair{kernels::cpu::kv_type::q4_0, true}}) {
      CAPTURE(std::string(kernels::cpu::kv_type_name(kv)));
      const auto block = static_cast<size_t>(models::kv_bytes_per_token(m.config(), kv) * 16);
      auto backend = memory::make_cpu_backend();
      memory::arbiter a(*backend, {64 << 20, 64 << 20});
      auto pool = memory::kv_pool::make(a, "m", 12, 16, block);  // 192 positions for ~6 x 90
      REQUIRE(pool);
      runtime::engine_model em{"m", &m, &tok, 0, 6, 128, kv, nullptr, pool.get()};
      em.kv_rotate = rotate;
      runtime::engine e({em}, {.threads = 2, .max_batch_tokens = 64, .prefill_chunk = 16});
      std::vector<std::shared_ptr<runtime::request_handle>> hs;
      for (const auto& p : prompts) hs.push_back(e.submit({"m", p, greedy(50)}));
      int differ_unrotated = 0;
      for (size_t i = 0; i < hs.size(); ++i) {
        CAPTURE(i);
        const auto got = collect(*hs[i]);
        CHECK(got == alone(m, tok, prompts[i], 50, 256, kv, rotate));
        differ_unrotated += got != alone(m, tok, prompts[i], 50, 256, kv, false);
      }
      // The rotation really is applied: q4_0 without it gives other tokens.
      if (rotate) CHECK(differ_unrotated > 0);
      e.drain();
      CHECK(e.preemptions() > 0);
      CHECK(e.kv_blocks_in_use("m") == 0);
      pool->check();
      a.check_integrity();
    }
  }

  TEST_CASE("prefix-cache hits skip the shared prompt and give what each request gives alone") {
    const models::model m(test::data_path("stories260K-q8_0.gguf").string());
    const auto tok = models::tokenizer::from_gguf(m.file());
    runtime::engine e({{"m", &m, &tok, 0, 4, 256}}, {.threads = 2, .max_batch_tokens = 64, .prefill_chunk = 16});
    std::vector<int32_t> system{1};
    for (int k = 0; k < 70; ++k) system.push_back(static_cast<int32_t>(20 + (k * 37) % 400));  // a shared "system prompt"
    auto with_tail = [&](int t) {
      auto p = system;
      for (int k = 0; k < 5 + t; ++k) p.push_back(static_cast<int32_t>(30 + (t * 11 + k) % 300));
      return p;
    };
    const auto first = e.submit({"m", with_tail(0), greedy(12)});
    CHECK(collect(*first) == alone(m, tok, with_tail(0), 12));
    e.drain();
    CHECK(e.kv_blocks_cached("m") > 0);
    CHECK(e.prefix_tokens_reused() == 0);
    std::vector<std::shared_ptr<runtime::request_handle>> hs;
    for (int t = 1; t <= 3; ++t) hs.push_back(e.submit({"m", with_tail(t), greedy(12)}));
    for (int t = 1; t <= 3; ++t) CHECK(collect(*hs[static_cast<size_t>(t - 1)]) == alone(m, tok, with_tail(t), 12));
    e.drain();
    CHECK(e.prefix_tokens_reused() >= 3 * 64);  // four full blocks of the 71-token system prompt each
    CHECK(e.kv_blocks_in_use("m") == 0);
  }

  TEST_CASE("prefix-cache blocks pushed off the device wait on the host; a later hit copies them back") {
    const models::model m(test::data_path("stories260K.gguf").string());
    const auto tok = models::tokenizer::from_gguf(m.file());
    const auto block = static_cast<size_t>(models::kv_bytes_per_token(m.config(), kernels::cpu::kv_type::f16) * 16);
    auto backend = memory::make_cpu_backend();
    memory::arbiter a(*backend, {64 << 20, 64 << 20});
    auto pool = memory::kv_pool::make(a, "m", 10, 16, block);  // 160 positions
    REQUIRE(pool);
    runtime::engine e({{"m", &m, &tok, 0, 1, 128, kernels::cpu::kv_type::f16, nullptr, pool.get()}},
                      {.threads = 2, .max_batch_tokens = 64, .prefill_chunk = 32, .prefix_host_blocks = 64});
    std::vector<int32_t> system{1};
    for (int k = 0; k < 70; ++k) system.push_back(static_cast<int32_t>(20 + (k * 37) % 400));
    auto with_tail = [&](int t) {
      auto p = system;
      for (int k = 0; k < 5 + t; ++k) p.push_back(static_cast<int32_t>(30 + (t * 11 + k) % 300));
      return p;
    };
    CHECK(collect(*e.submit({"m", with_tail(0), greedy(10)})) == alone(m, tok, with_tail(0), 10));
    e.drain();
    // Unrelated prompts need the whole pool: the cached blocks go to the host.
    for (int i = 0; i < 3; ++i) {
      std::vector<int32_t> other{1};
      for (int k = 0; k < 100; ++k) other.push_back(static_cast<int32_t>(100 + (k * 13 + i * 7) % 300));
      CHECK(collect(*e.submit({"m", other, greedy(20)})).size() == 20);
      e.drain();
    }
    CHECK(e.kv_blocks_cached_on_host("m") >= 4);
    const int64_t reused = e.prefix_tokens_reused();
    CHECK(collect(*e.submit({"m", with_tail(1), greedy(10)})) == alone(m, tok, with_tail(1), 10));
    e.drain();
    CHECK(e.prefix_blocks_restored() >= 4);
    CHECK(e.prefix_tokens_reused() >= reused + 64);
    CHECK(e.kv_blocks_in_use("m") == 0);
    pool->check();
    a.check_integrity();
  }

  TEST_CASE("when KV is tight, a waiting request with a cached prefix is admitted first") {
    const models::model m(test::data_path("stories260K.gguf").string());
    const auto tok = models::tokenizer::from_gguf(m.file());
    // One sequence slot over 10 blocks of 16 positions.
    runtime::engine e({{"m", &m, &tok, 0, 1, 160}}, {.threads = 2, .max_batch_tokens = 64, .prefill_chunk = 32});
    std::vector<int32_t> system{1};
    for (int k = 0; k < 70; ++k) system.push_back(static_cast<int32_t>(20 + (k * 37) % 400));
    auto with_tail = [&](int t) {
      auto p = system;
      for (int k = 0; k < 5 + t; ++k) p.push_back(static_cast<int32_t>(30 + (t * 11 + k) % 300));
      return p;
    };
    collect(*e.submit({"m", with_tail(0), greedy(4)}));
    e.drain();
    std::vector<int32_t> long_prompt{1}, unrelated{1};
    for (int k = 0; k < 100; ++k) long_prompt.push_back(static_cast<int32_t>(100 + (k * 13) % 300));
    for (int k = 0; k < 40; ++k) unrelated.push_back(static_cast<int32_t>(50 + (k * 29) % 300));
    // The long request holds the only slot and pushes part of the system prompt's blocks
    // out; A (nothing cached) and then B (the system prompt's start cached) wait behind it.
    auto busy = e.submit({"m", long_prompt, greedy(20)});
    auto a = e.submit({"m", unrelated, greedy(4)});
    auto b = e.submit({"m", with_tail(1), greedy(4)});
    // Both waited behind it only if it is still running now (a slow test thread may see it end
    // first; then A took the slot alone and the order says nothing).
    const bool both_waited = busy->finished() == runtime::finish_reason::none;
    CHECK(collect(*b) == alone(m, tok, with_tail(1), 4));
    CHECK(collect(*a) == alone(m, tok, unrelated, 4));
    busy->wait();
    if (both_waited) CHECK(b->finished_at() < a->finished_at());
    CHECK(e.prefix_tokens_reused() >= 32);
    e.drain();
    CHECK(e.kv_blocks_in_use("m") == 0);
  }

  TEST_CASE("cancelling at random points frees every KV block") {
    const models::model m(test::data_path("stories260K-q8_0.gguf").string());
    const auto tok = models::tokenizer::from_gguf(m.file());
    runtime::engine e({{"m", &m, &tok, 0, 4, 128}}, {.threads = 2, .max_batch_tokens = 32, .prefill_chunk = 8});
    std::mt19937 rng(42);
    std::vector<std::shared_ptr<runtime::request_handle>> hs;
    for (int i = 0; i < 24; ++i) {
      std::vector<int32_t> p{1};
      for (int k = 0; k < 5 + static_cast<int>(rng() % 40); ++k) p.push_back(static_cast<int32_t>(10 + rng() % 400));
      auto h = e.submit({"m", p, greedy(20 + static_cast<int64_t>(rng() % 60))});
      hs.push_back(h);
      switch (rng() % 3) {
        case 0:
          h->cancel();
          break;  // before it starts, most likely
        case 1: {
          int32_t t = 0;
          for (int k = 0; k < static_cast<int>(rng() % 5) && h->next(&t, 10s); ++k) {
          }
          h->cancel();
          break;
        }
        default:
          break;
      }
    }
    e.drain();
    int cancelled = 0;
    for (const auto& h : hs) {
      CHECK(h->finished() != runtime::finish_reason::none);
      cancelled += h->finished() == runtime::finish_reason::cancelled;
    }
    CHECK(cancelled > 0);
    CHECK(e.kv_blocks_in_use("m") == 0);
  }

  TEST_CASE("two models in one engine: both complete, nothing dropped") {
    const models::model m(test::data_path("stories260K.gguf").string());
    const auto tok = models::tokenizer::from_gguf(m.file());
    runtime::engine e({{"low", &m, &tok, 0, 2, 256}, {"high", &m, &tok, 100, 2, 256}}, {.threads = 1, .max_batch_tokens = 64, .prefill_chunk = 32});
    const std::vector<int32_t> p = {1, 403, 407, 261};
    std::vector<std::shared_ptr<runtime::request_handle>> low, high;
    for (int i = 0; i < 2; ++i) low.push_back(e.submit({"low", p, greedy(120)}));
    for (int i = 0; i < 2; ++i) high.push_back(e.submit({"high", p, greedy(8)}));
    for (auto& h : high) {
      h->wait();
      CHECK(h->finished() == runtime::finish_reason::length);
    }
    e.drain();
    for (auto& h : low) CHECK(collect(*h).size() == 120);
    CHECK(e.kv_blocks_in_use("low") == 0);
    CHECK(e.kv_blocks_in_use("high") == 0);
  }

  TEST_CASE("two models on a device budget that holds one: placed by the plan, served by priority, nothing dropped") {
    const models::model lo(test::data_path("stories260K.gguf").string());
    const models::model hi(test::data_path("stories260K-q8_0.gguf").string());
    const auto lo_tok = models::tokenizer::from_gguf(lo.file());
    const auto hi_tok = models::tokenizer::from_gguf(hi.file());
    constexpr size_t blk = 16 << 10;
    auto weights = [&](const models::model& m) { return test::weight_bytes_in_blocks(m, blk); };
    const auto kv_block = test::kv_block_bytes;
    const int32_t kv_blocks = 3 * 256 / 16;
    const uint64_t kv_bytes = ((kv_blocks * kv_block(lo) + blk - 1) / blk + (kv_blocks * kv_block(hi) + blk - 1) / blk) * blk;
    // Both KV pools and the larger model's weights, with a little room, but not both models.
    const uint64_t device = kv_bytes + std::max(weights(lo), weights(hi)) + 4 * blk;
    REQUIRE(device < kv_bytes + weights(lo) + weights(hi));

    configs::roster r;
    configs::model_entry low, high;
    low.name = "low";
    low.priority = 0;
    high.name = "high";
    high.priority = 100;
    for (auto* e : {&low, &high}) {
      e->keep_alive.forever = true;
      e->max_sequences = 3;
      e->context = 256;
    }
    r.models = {low, high};
    r.policy.hysteresis = std::chrono::milliseconds(0);
    r.policy.prefetch = false;
    r.policy.stream = false;
    r.policy.idle_grace = std::chrono::milliseconds(50);  // the idle high model gives the device back soon

    auto backend = memory::make_cpu_backend();
    memory::arbiter a(*backend, {device, uint64_t{16} << 20, blk});
    auto lo_kv = memory::kv_pool::make(a, "low", kv_blocks, 16, kv_block(lo));
    auto hi_kv = memory::kv_pool::make(a, "high", kv_blocks, 16, kv_block(hi));
    REQUIRE(lo_kv);
    REQUIRE(hi_kv);
    models::arbiter_residency lo_place(a, lo, "low"), hi_place(a, hi, "high");
    std::vector<std::vector<int32_t>> lo_out, hi_out;
    {
      runtime::engine e({{"low", &lo, &lo_tok, 0, 3, 256, kernels::cpu::kv_type::f16, nullptr, lo_kv.get(), &lo_place},
                         {"high", &hi, &hi_tok, 100, 3, 256, kernels::cpu::kv_type::f16, nullptr, hi_kv.get(), &hi_place}},
                        {.threads = 2, .max_batch_tokens = 64, .prefill_chunk = 32, .roster = &r});
      const std::vector<std::vector<int32_t>> lo_prompts = {{1, 403, 407, 261}, {1, 300, 12, 99, 5}, {1, 77}};
      const std::vector<std::vector<int32_t>> hi_prompts = {{1, 260, 33}, {1, 410, 411, 412}};
      std::vector<std::shared_ptr<runtime::request_handle>> lows, highs;
      for (const auto& p : lo_prompts) lows.push_back(e.submit({"low", p, greedy(200)}));
      int32_t first = 0;
      REQUIRE(lows[0]->next(&first, 60s));  // the low model is on the device and generating
      for (const auto& p : hi_prompts) highs.push_back(e.submit({"high", p, greedy(12)}));
      for (size_t i = 0; i < highs.size(); ++i) {
        CAPTURE(i);
        CHECK(collect(*highs[i]) == alone(hi, hi_tok, hi_prompts[i], 12));
        CHECK(highs[i]->finished() == runtime::finish_reason::length);
      }
      for (size_t i = 0; i < lows.size(); ++i) {
        CAPTURE(i);
        auto got = collect(*lows[i]);
        if (i == 0) got.insert(got.begin(), first);
        CHECK(got == alone(lo, lo_tok, lo_prompts[i], 200));
        CHECK(lows[i]->finished() == runtime::finish_reason::length);
      }
      // The higher priority ended first: its requests took the device from the running ones.
      for (const auto& h : highs)
        for (const auto& l : lows) CHECK(h->finished_at() < l->finished_at());
      e.drain();
      CHECK(e.preemptions() >= 1);
      CHECK(e.kv_blocks_in_use("low") == 0);
      CHECK(e.kv_blocks_in_use("high") == 0);
      a.check_integrity();
      const auto snap = a.snapshot();
      for (const auto& o : snap.owners)
        if (o.who.kind == memory::owner_kind::kv) CHECK(o.host == 0);  // no swapped KV left behind
    }
    a.check_integrity();
  }

  TEST_CASE("a roster model that could not run even alone on the device is refused at construction") {
    const models::model m(test::data_path("stories260K.gguf").string());
    const auto tok = models::tokenizer::from_gguf(m.file());
    constexpr size_t blk = 16 << 10;
    uint64_t weights = 0, largest = 0;
    for (const auto& s : models::segment_sources(m)) {
      weights += (s.bytes + blk - 1) / blk * blk;
      largest = std::max<uint64_t>(largest, (s.bytes + blk - 1) / blk * blk);
    }
    const auto kv_block = static_cast<size_t>(models::kv_bytes_per_token(m.config(), kernels::cpu::kv_type::f16) * 16);
    const uint64_t kv_bytes = (16 * kv_block + blk - 1) / blk * blk;
    configs::roster r;
    configs::model_entry e;
    e.name = "m";
    r.models = {e};
    // Room for the KV pool and what streaming needs (three stream slots, and half the weights
    // for the planner to start it), not for all the weights.
    const uint64_t device = kv_bytes + std::max<uint64_t>(3 * largest, weights / 2) + 3 * blk;
    REQUIRE(device < kv_bytes + weights);
    for (const bool stream : {false, true}) {
      CAPTURE(stream);
      r.policy.stream = stream;
      auto backend = memory::make_cpu_backend();
      memory::arbiter a(*backend, {device, 8 << 20, blk});
      auto pool = memory::kv_pool::make(a, "m", 16, 16, kv_block);
      REQUIRE(pool);
      models::arbiter_residency place(a, m, "m");
      auto make = [&] {
        runtime::engine eng({{"m", &m, &tok, 0, 1, 256, kernels::cpu::kv_type::f16, nullptr, pool.get(), &place}}, {.threads = 1, .roster = &r});
        // Streamed, it runs.
        CHECK(collect(*eng.submit({"m", {1, 403, 407}, greedy(6)})) == alone(m, tok, {1, 403, 407}, 6));
      };
      if (stream) {
        make();
      } else {
        CHECK_THROWS_WITH_AS(make(), doctest::Contains("model 'm' cannot run"), std::invalid_argument);
      }
      a.check_integrity();
    }
  }

  TEST_CASE("stop strings end the text before them; held-back text comes out at the end") {
    const models::model m(test::data_path("stories260K.gguf").string());
    const auto tok = models::tokenizer::from_gguf(m.file());
    runtime::engine e({{"m", &m, &tok, 0, 4, 256}}, {.threads = 2, .max_batch_tokens = 64, .prefill_chunk = 16});
    const std::vector<int32_t> prompt = {1, 403, 407, 261};
    const auto ids = alone(m, tok, prompt, 60);
    models::detokenizer_stream d(tok);
    std::string full;
    for (const int32_t id : ids) full += d.push(id);
    full += d.flush();
    REQUIRE(full.size() > 40);
    auto read = [&](runtime::request_handle& h, std::vector<int32_t>* toks) {
      std::string text;
      runtime::piece p;
      while (h.next(&p, 60s)) {
        if (p.token >= 0) toks->push_back(p.token);
        text += p.text;
      }
      return text;
    };
    // A stop string from the middle of the text, and one that never appears.
    const std::string stop = full.substr(30, 6);
    auto params = greedy(60);
    params.stop = {"never in this story", stop};
    auto h = e.submit({"m", prompt, params});
    std::vector<int32_t> toks;
    CHECK(read(*h, &toks) == full.substr(0, full.find(stop)));
    CHECK(h->finished() == runtime::finish_reason::stop);
    CHECK(std::string(runtime::finish_name(h->finished())) == "stop");
    REQUIRE(toks.size() < ids.size());
    CHECK(std::equal(toks.begin(), toks.end(), ids.begin()));
    // Without a match: the whole text, the tail held for a possible match released at the end.
    params.stop = {full.substr(full.size() - 3) + "zzz"};
    h = e.submit({"m", prompt, params});
    toks.clear();
    CHECK(read(*h, &toks) == full);
    CHECK(toks == ids);
    CHECK(h->finished() == runtime::finish_reason::length);
    params.stop = {""};
    CHECK_THROWS_AS(e.submit({"m", prompt, params}), std::invalid_argument);
    e.drain();
    CHECK(e.kv_blocks_in_use("m") == 0);
  }

  TEST_CASE("bad requests are refused at submit") {
    const models::model m(test::data_path("stories260K.gguf").string());
    const auto tok = models::tokenizer::from_gguf(m.file());
    runtime::engine e({{"m", &m, &tok, 0, 2, 64}}, {});
    CHECK_THROWS_WITH_AS(e.submit({"nope", {1}, {}}), "unknown model 'nope'", std::invalid_argument);
    CHECK_THROWS_AS(e.submit({"m", {}, {}}), std::invalid_argument);
    CHECK_THROWS_AS(e.submit({"m", std::vector<int32_t>(64, 1), {}}), std::invalid_argument);
    CHECK_THROWS_AS(e.submit({"m", {99999}, {}}), std::invalid_argument);
    runtime::generation_params bad;
    bad.sampling.top_p = 2;
    CHECK_THROWS_AS(e.submit({"m", {1}, bad}), std::invalid_argument);
  }

  TEST_CASE("a model's queue limit refuses submissions beyond it with queue_full") {
    const models::model m(test::data_path("stories260K.gguf").string());
    const auto tok = models::tokenizer::from_gguf(m.file());
    runtime::engine_model em{"m", &m, &tok, 0, 1, 256};
    em.max_queue = 1;
    runtime::engine e({em}, {.threads = 1});
    auto a = e.submit({"m", {1, 403}, greedy(200)});
    int32_t t = 0;
    REQUIRE(a->next(&t, 60s));                      // running
    auto b = e.submit({"m", {1, 404}, greedy(5)});  // waiting: the one place in the queue
    CHECK_THROWS_AS(e.submit({"m", {1, 405}, greedy(5)}), runtime::queue_full);
    const auto st = e.stats("m");
    CHECK(st.running == 1);
    CHECK(st.queued == 1);
    a->cancel();
    CHECK(collect(*b).size() == 5);
    CHECK_NOTHROW(e.submit({"m", {1, 405}, greedy(1)})->wait());
  }

  TEST_CASE("operator controls: load, evict with a sequence running (it resumes), pin, priority and keep-alive") {
    const models::model m(test::data_path("stories260K.gguf").string());
    const auto tok = models::tokenizer::from_gguf(m.file());
    configs::roster r;
    configs::model_entry me;
    me.name = "m";
    me.context = 256;
    me.max_sequences = 2;
    r.models = {me};
    r.policy.prefetch = false;
    auto backend = memory::make_cpu_backend();
    memory::arbiter a(*backend, {uint64_t{32} << 20, uint64_t{32} << 20, 16 << 10});
    const auto block = static_cast<size_t>(models::kv_bytes_per_token(m.config(), kernels::cpu::kv_type::f16) * 16);
    auto kv = memory::kv_pool::make(a, "m", 32, 16, block);
    models::arbiter_residency place(a, m, "m");
    auto on_device = [&] {
      for (const auto& ms : a.snapshot().models)
        for (const auto& seg : ms.segments)
          if (seg.device != memory::residency::resident) return false;
      return true;
    };
    auto until = [](auto pred) {
      for (int i = 0; i < 2000 && !pred(); ++i) std::this_thread::sleep_for(5ms);
      return pred();
    };
    // The holds of the eviction check below; declared before the engine so that they outlive
    // any notify call its thread may still be in when the test ends.
    struct hold_state {
      std::mutex m;
      std::condition_variable cv;
      bool held = false, release = false;
    };
    std::deque<hold_state> holds;
    runtime::engine e({{"m", &m, &tok, 0, 2, 256, kernels::cpu::kv_type::f16, nullptr, kv.get(), &place}}, {.threads = 1, .roster = &r});
    CHECK_FALSE(on_device());
    e.control("m", {.load = true});
    CHECK(until(on_device));
    CHECK(until([&] { return e.stats("m").swap_ins == 1 && e.stats("m").last_swap_in_seconds >= 0; }));

    // The eviction must land while the sequence runs: the engine's thread is held inside a
    // token's delivery (the handle's notify) until the eviction is queued, so it applies at
    // that pass's end with tokens still to come. The hold can only be installed once submit()
    // has returned, and on a loaded machine the engine may have produced most of the 120
    // tokens (or all) by then: such a try runs to its end without an eviction and another
    // starts, so the eviction always meets at least 60 tokens to go (the tokens readable while
    // the engine is held are those before the hold).
    const std::vector<int32_t> prompt{1, 403, 407};
    const auto want = alone(m, tok, prompt, 120);
    const auto test_thread = std::this_thread::get_id();
    bool evicted = false;
    for (int attempt = 0; attempt < 20 && !evicted; ++attempt) {
      CAPTURE(attempt);
      auto h = e.submit({"m", prompt, greedy(120)});
      hold_state& hs = holds.emplace_back();
      h->set_notify([&hs, test_thread] {
        if (std::this_thread::get_id() == test_thread) return;  // set_notify's own call
        std::unique_lock lock(hs.m);
        if (hs.held) return;
        hs.held = true;
        hs.cv.notify_all();
        hs.cv.wait(lock, [&] { return hs.release; });
      });
      bool held = false;
      for (int i = 0; i < 6000 && !held && h->finished() == runtime::finish_reason::none; ++i) {
        std::unique_lock lock(hs.m);
        held = hs.cv.wait_for(lock, 10ms, [&] { return hs.held; });
      }
      std::vector<int32_t> got;
      int32_t t = 0;
      while (h->next(&t, 0ms)) got.push_back(t);
      // (Not when the request has finished, e.g. in error: the engine may be holding its own
      // lock inside the last notify, where control() would wait for it.)
      if (held && got.size() <= 60 && h->finished() == runtime::finish_reason::none) {
        e.control("m", {.evict = true});
        evicted = true;
      }
      {
        std::lock_guard lock(hs.m);
        hs.release = true;
      }
      hs.cv.notify_all();
      const auto rest = collect(*h);
      got.insert(got.end(), rest.begin(), rest.end());
      h->set_notify({});
      CHECK(got == want);  // swapped out, brought back, bit for bit
    }
    REQUIRE(evicted);
    CHECK(until([&] { return e.stats("m").swap_outs >= 1; }));
    CHECK(e.stats("m").preemptions >= 1);

    e.control("m", {.priority = 42, .pinned = true, .keep_alive = configs::keep_alive_setting{true, {}}});
    CHECK(until([&] { return e.stats("m").priority == 42; }));
    CHECK(e.stats("m").pinned);
    CHECK(e.stats("m").keep_alive.forever);
    CHECK_THROWS_AS(e.control("nope", {}), std::invalid_argument);
    e.drain();
    CHECK(e.kv_blocks_in_use("m") == 0);
    a.check_integrity();
  }

  TEST_CASE("controls need a roster") {
    const models::model m(test::data_path("stories260K.gguf").string());
    const auto tok = models::tokenizer::from_gguf(m.file());
    runtime::engine e({{"m", &m, &tok}}, {.threads = 1});
    CHECK_THROWS_AS(e.control("m", {.load = true}), std::invalid_argument);
    CHECK(e.stats("m").kv_blocks_total > 0);
  }
}
