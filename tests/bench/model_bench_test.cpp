// bench/model_bench: token ids, bytes read per decoded token, and the three timed phases on
// the committed tiny model.
#include "bench/model_bench.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <string>

#include "models/synth.h"
#include "tests/test_support.h"

using namespace tandem;

namespace {
// Small phases, two repetitions each.
bench::model_bench_params two_reps(int64_t prompt, int64_t gen, int64_t batch) {
  bench::model_bench_params p;
  p.prompt = prompt;
  p.gen = gen;
  p.batch = batch;
  p.reps = 2;
  return p;
}
}  // namespace

TEST_SUITE("bench_model") {
  TEST_CASE("bench_tokens: in range, repeatable, seed-dependent, not constant") {
    const auto a = bench::bench_tokens(512, 1000, 1);
    const auto b = bench::bench_tokens(512, 1000, 1);
    const auto c = bench::bench_tokens(512, 1000, 2);
    REQUIRE(a.size() == 1000);
    CHECK(a == b);
    CHECK(a != c);
    CHECK(*std::min_element(a.begin(), a.end()) >= 0);
    CHECK(*std::max_element(a.begin(), a.end()) < 512);
    // 1000 draws over 512 ids hit well over half of them.
    auto sorted = a;
    std::sort(sorted.begin(), sorted.end());
    CHECK(std::unique(sorted.begin(), sorted.end()) - sorted.begin() > 300);
    CHECK(bench::bench_tokens(512, 0, 1).empty());
    CHECK_THROWS_AS(bench::bench_tokens(0, 4, 1), std::invalid_argument);
  }

  TEST_CASE("decode_weight_bytes: every tensor but the embedding table, of which one row") {
    // stories260K (F32, untied): 1171200 bytes of tensors, token_embd 512 rows x 64 x 4 bytes.
    const models::model m(test::data_path("stories260K.gguf").string());
    CHECK(m.weight_bytes() == 1171200);
    CHECK(bench::decode_weight_bytes(m) == 1171200 - 512 * 64 * 4 + 64 * 4);
    CHECK(bench::main_weight_type(m) == kernels::weight_type::f32);

    // The Q8_0 file: Q8_0 holds most bytes though some tensors are F16 / F32. As stored in the
    // file when nothing is packed; packed matrices count at their packed size (the 172-row
    // FFN matrices pad to 176 rows).
    const models::model q(test::data_path("stories260K-q8_0.gguf").string(), {.pack_weights = false});
    CHECK(bench::main_weight_type(q) == kernels::weight_type::q8_0);
    const auto& embd = q.file().tensor("token_embd.weight");
    CHECK(bench::decode_weight_bytes(q) == q.weight_bytes() - embd.bytes + embd.bytes / 512);
    const models::model packed(test::data_path("stories260K-q8_0.gguf").string());
    uint64_t extra = 0;
    for (const auto& L : packed.weights().layers)
      for (const models::weight_view* v : {&L.wq, &L.wk, &L.wv, &L.wo, &L.w_gate, &L.w_up, &L.w_down})
        if (v->layout == kernels::cpu::weight_layout::packed) {
          CHECK(v->type == kernels::weight_type::q8_0);
          extra += kernels::cpu::packed_bytes(v->type, v->rows, v->cols) - static_cast<uint64_t>(v->rows * kernels::row_bytes(v->type, v->cols));
        }
    if (kernels::cpu::pack_at_load(kernels::weight_type::q8_0)) CHECK(extra > 0);
    CHECK(bench::decode_weight_bytes(packed) == bench::decode_weight_bytes(q) + extra);
  }

  TEST_CASE("decode_int8_macs: rows x cols of the quantized projections and output head only") {
    // F32 weights multiply in float: no int8 dots at all.
    const models::model f(test::data_path("stories260K.gguf").string());
    CHECK(bench::decode_int8_macs(f) == 0);
    // The Q8_0 file: its Q8_0 matrices, counted from the file's tensor table (packing does not
    // change the count; the embedding lookup is not a product).
    const models::model q(test::data_path("stories260K-q8_0.gguf").string());
    uint64_t want = 0;
    for (const auto& t : q.file().tensors()) {
      const bool matrix = t.name == "output.weight" || (t.name.rfind("blk.", 0) == 0 && t.ne.size() == 2);
      if (matrix && t.type == kernels::weight_type::q8_0) want += static_cast<uint64_t>(t.elements());
    }
    CHECK(want > 0);
    CHECK(bench::decode_int8_macs(q) == want);
  }

  TEST_CASE("decode_weight_bytes: a tied output head reads the whole table") {
    test::scratch_dir dir;
    models::synth_options o;
    o.dim = 64;
    o.layers = 1;
    o.heads = 4;
    o.ffn = 128;
    o.tied = true;
    o.vocab_path = test::data_path("stories260K.gguf").string();
    o.type = kernels::weight_type::q8_0;
    o.seed = 5;
    const auto path = (dir / "tied.gguf").string();
    models::synth_model(o, path);
    const models::model m(path);
    REQUIRE(m.config().tied_embeddings);
    const auto& embd = m.file().tensor("token_embd.weight");
    CHECK(bench::decode_weight_bytes(m) == m.weight_bytes() + embd.bytes / 512);
  }

  TEST_CASE("run_model_bench: one positive figure per repetition for each phase") {
    const models::model m(test::data_path("stories260K.gguf").string());
    kernels::cpu::thread_pool pool(2);
    const auto p = two_reps(24, 6, 3);
    int hooked = 0;  // the hook runs once after each decode repetition
    const auto r = bench::run_model_bench(m, pool, p, [&] { ++hooked; });
    CHECK(hooked == 2);
    for (const auto* v : {&r.prefill_tok_s, &r.decode_tok_s, &r.batched_decode_tok_s, &r.decode_as_batched_tok_s, &r.decode_gb_s}) {
      REQUIRE(v->size() == 2);
      for (double x : *v) CHECK(x > 0);
    }
    CHECK(r.decode_bytes_per_token == bench::decode_weight_bytes(m));
    CHECK(r.decode.count == 2);
    // GB/s is bytes per token times tok/s, repetition by repetition.
    for (size_t i = 0; i < 2; ++i)
      CHECK(r.decode_gb_s[i] == doctest::Approx(static_cast<double>(r.decode_bytes_per_token) * r.decode_tok_s[i] / 1e9));
    CHECK(r.prefill.median >= r.prefill.min);
    CHECK(r.batched_decode.max >= r.batched_decode.median);
    CHECK(r.decode_as_batched.count == 2);
    CHECK(r.decode_as_batched.min <= r.decode_as_batched.median);
    CHECK(r.prefill_start_position == 0);  // no --depth: from an empty cache
    CHECK(r.decode_start_position == 0);
    CHECK(r.batched_start_position == 0);
  }

  TEST_CASE("run_model_bench: compare_layer_teams decodes a second context with layer teams, once per repetition") {
    const models::model m(test::data_path("stories260K.gguf").string());
    kernels::cpu::thread_pool pool(2);
    auto p = two_reps(8, 4, 2);
    p.reps = 3;
    int hooked = 0;
    const auto plain = bench::run_model_bench(m, pool, p, [&] { ++hooked; });
    CHECK(plain.decode_layer_teams_tok_s.empty());
    p.compare_layer_teams = true;
    const auto r = bench::run_model_bench(m, pool, p, [&] { ++hooked; });
    CHECK(hooked == 6);  // still once per decode repetition
    REQUIRE(r.decode_layer_teams_tok_s.size() == 3);
    for (double x : r.decode_layer_teams_tok_s) CHECK(x > 0);
    CHECK(r.decode_tok_s.size() == 3);
    CHECK(r.decode_layer_teams.count == 3);
    CHECK(r.decode_start_position == 0);
    CHECK(r.batched_start_position == 0);
  }

  TEST_CASE("run_model_bench: compare_prompt prefills by llama.cpp's arithmetic too, once per repetition") {
    const models::model m(test::data_path("stories260K.gguf").string());
    kernels::cpu::thread_pool pool(2);
    auto p = two_reps(8, 4, 2);
    p.reps = 3;
    const auto plain = bench::run_model_bench(m, pool, p);
    CHECK(plain.prefill_exact_tok_s.empty());
    CHECK(plain.prefill_exact.count == 0);
    p.compare_prompt = true;
    const auto r = bench::run_model_bench(m, pool, p);
    REQUIRE(r.prefill_exact_tok_s.size() == 3);
    for (double x : r.prefill_exact_tok_s) CHECK(x > 0);
    CHECK(r.prefill_tok_s.size() == 3);
    CHECK(r.prefill_exact.count == 3);
    CHECK(r.prefill_start_position == 0);
    // Both figures would be llama.cpp's.
    p.fast_prompt_attention = false;
    CHECK_THROWS_WITH_AS(bench::run_model_bench(m, pool, p), doctest::Contains("compare_prompt"), std::invalid_argument);
  }

  TEST_CASE("run_model_bench: --depth starts the timed prefill, decode and batched decode that deep in the cache") {
    const models::model m(test::data_path("stories260K.gguf").string());
    kernels::cpu::thread_pool pool(2);
    auto p = two_reps(8, 4, 2);
    p.depth = 40;  // more than one fill chunk: max_batch is min(prompt, 512) = 8
    for (const bool fast : {false, true}) {
      CAPTURE(fast);
      p.fast_prompt_attention = p.fast_decode_attention = fast;
      const auto deep = bench::run_model_bench(m, pool, p);
      CHECK(deep.prefill_start_position == 40);
      CHECK(deep.decode_start_position == 40);
      CHECK(deep.batched_start_position == 40);
      for (const auto* v : {&deep.prefill_tok_s, &deep.decode_tok_s, &deep.batched_decode_tok_s}) {
        REQUIRE(v->size() == 2);
        for (double x : *v) CHECK(x > 0);
      }
    }
  }

  TEST_CASE("run_model_bench: decode_pause_every runs during_decode within each timed decode, never after its last token") {
    const models::model m(test::data_path("stories260K.gguf").string());
    kernels::cpu::thread_pool pool(2);
    auto p = two_reps(8, 7, 2);
    int after = 0, during = 0;
    // The order a repetition sees: pauses after tokens 3 and 6 of 7, then the end.
    std::string order;
    p.decode_pause_every = 3;
    const auto r = bench::run_model_bench(
        m, pool, p, [&] { ++after, order += 'A'; }, [&] { ++during, order += 'd'; });
    CHECK(after == 2);
    CHECK(during == 4);
    CHECK(order == "ddAddA");
    REQUIRE(r.decode_tok_s.size() == 2);
    for (double x : r.decode_tok_s) CHECK(x > 0);
    // A pause at the last token would fall after the decode: 6 of 6 pauses only at 3.
    p.gen = 6;
    order.clear();
    bench::run_model_bench(
        m, pool, p, [&] { order += 'A'; }, [&] { order += 'd'; });
    CHECK(order == "dAdA");
    // Off (0, the default): no pauses.
    p.decode_pause_every = 0;
    order.clear();
    bench::run_model_bench(
        m, pool, p, [&] { order += 'A'; }, [&] { order += 'd'; });
    CHECK(order == "AA");
    // The layer-teams comparison's second context never pauses.
    p.decode_pause_every = 2;
    p.compare_layer_teams = true;
    order.clear();
    bench::run_model_bench(
        m, pool, p, [&] { order += 'A'; }, [&] { order += 'd'; });
    CHECK(order == "ddAddA");
  }

  TEST_CASE("run_model_bench refuses out-of-range parameters, naming them") {
    const models::model m(test::data_path("stories260K.gguf").string());
    kernels::cpu::thread_pool pool(1);
    auto expect_error = [&](bench::model_bench_params p, const char* name) {
      CAPTURE(name);
      try {
        bench::run_model_bench(m, pool, p);
        FAIL("no exception");
      } catch (const std::invalid_argument& e) {
        CHECK(std::string(e.what()).find(name) != std::string::npos);
      }
    };
    bench::model_bench_params p;
    p.prompt = 0;
    expect_error(p, "prompt");
    p = {};
    p.gen = 0;
    expect_error(p, "gen");
    p = {};
    p.batch = 0;
    expect_error(p, "batch");
    p = {};
    p.batch = 100000;
    expect_error(p, "batch");
    p = {};
    p.decode_pause_every = -1;
    expect_error(p, "decode_pause_every");
    p = {};
    p.reps = 0;
    expect_error(p, "reps");
    p = {};
    p.depth = -1;
    expect_error(p, "depth");
    p = {};
    p.depth = models::k_max_context;  // no room left for the prompt
    expect_error(p, "depth");
  }
}
