// The forward pass reading its weights through a memory arbiter: every device budget, from
// the whole model to about one layer (streamed through stream slots), gives the logits of
// the model that owns its weights, bit for bit.
#include "models/arbiter_residency.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "memory/arbiter.h"
#include "memory/cpu_backend.h"
#include "models/forward.h"
#include "models/synth.h"
#include "models/weight_plan.h"
#include "tests/test_support.h"

using namespace tandem;

namespace {

struct run_result {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;  // after the prompt and after each generated token
};

run_result greedy(const models::model& m, models::weight_residency* res, int n_gen) {
  kernels::cpu::thread_pool pool(2);
  models::forward_context ctx(m, {.n_ctx = 64, .max_batch = 8}, &pool, res);
  const std::vector<int32_t> prompt = {1, 403, 407, 261, 378, 432, 300, 301, 302, 11, 12};  // 11 tokens: two chunks of 8
  run_result out;
  ctx.eval(prompt);
  for (int i = 0; i < n_gen; ++i) {
    const auto lg = ctx.logits();
    out.logits.emplace_back(lg.begin(), lg.end());
    const auto tok = static_cast<int32_t>(std::max_element(lg.begin(), lg.end()) - lg.begin());
    out.tokens.push_back(tok);
    ctx.eval({&tok, 1});
  }
  return out;
}

uint64_t blocks_of(const models::weight_plan& p, size_t block) {
  uint64_t n = 0;
  for (const auto& s : p.segments) n += std::max<uint64_t>(1, (s.bytes + block - 1) / block) * block;
  return n;
}

// Runs `m` with the given device budget (bytes): loads the segments in order while they fit,
// streams the rest. host: whether the model is staged in the host tier first.
run_result run_with_budget(const models::model& m, uint64_t device, bool host, int depth, int n_gen, int* resident = nullptr) {
  auto backend = memory::make_cpu_backend();
  const auto& plan = m.plan();
  memory::arbiter a(*backend, {device, host ? blocks_of(plan, memory::k_default_block_bytes) : 0});
  models::arbiter_residency res(a, m, "model", depth);
  if (host) {
    auto st = a.stage(res.id());
    REQUIRE(st.st == memory::status::ok);
  }
  // Slots first when the whole model does not fit, then as many whole segments as fit.
  const bool fits = blocks_of(plan, memory::k_default_block_bytes) <= device;
  if (!fits) REQUIRE(a.reserve_stream_slots(res.id(), depth + 1) == memory::status::ok);
  int loaded = 0;
  for (int s = 0; s <= plan.last_segment(); ++s)
    if (a.load(res.id(), {s, 1}).st == memory::status::ok) ++loaded;
  if (fits) REQUIRE(loaded == plan.last_segment() + 1);
  REQUIRE(res.prepare_streaming() == memory::status::ok);
  if (resident) *resident = loaded;
  auto r = greedy(m, &res, n_gen);
  a.check_integrity();
  return r;
}

void check_same(const run_result& got, const run_result& want) {
  CHECK(got.tokens == want.tokens);
  REQUIRE(got.logits.size() == want.logits.size());
  for (size_t i = 0; i < got.logits.size(); ++i) CHECK(got.logits[i] == want.logits[i]);
}

}  // namespace

TEST_SUITE("arbiter_residency") {
  TEST_CASE("the test model: 100%, 50% and about one layer of device memory give the same logits") {
    const auto path = test::data_path("stories260K.gguf").string();
    const models::model owned(path);
    const models::model lazy(path, {.own_weights = false});
    const auto want = greedy(owned, nullptr, 12);
    const auto& plan = lazy.plan();
    const uint64_t all = blocks_of(plan, memory::k_default_block_bytes);
    const uint64_t block = memory::k_default_block_bytes;
    const uint64_t one_layer = (plan.largest_segment() + block - 1) / block * block;
    for (const bool host : {true, false}) {
      CAPTURE(host);
      int resident = 0;
      check_same(run_with_budget(lazy, all, host, 2, 12, &resident), want);
      CHECK(resident == plan.last_segment() + 1);
      check_same(run_with_budget(lazy, all / 2 + 3 * one_layer, host, 2, 12, &resident), want);
      CHECK(resident > 0);
      CHECK(resident < plan.last_segment() + 1);
      check_same(run_with_budget(lazy, one_layer, host, 0, 12, &resident), want);
      CHECK(resident == 0);
    }
  }

  TEST_CASE("a table larger than a layer is cut into pieces, tied or not, and streams the same") {
    test::scratch_dir dir;
    for (const bool tied : {false, true}) {
      CAPTURE(tied);
      models::synth_options o;
      o.dim = 64;
      o.layers = 3;
      o.heads = 2;
      o.ffn = 64;
      o.context = 64;
      o.tied = tied;
      o.vocab_path = test::data_path("stories260K.gguf").string();
      o.type = kernels::weight_type::q8_0;
      o.seed = 3;
      const auto path = (dir / (tied ? "tied.gguf" : "untied.gguf")).string();
      models::synth_model(o, path);
      const models::model owned(path);
      const models::model lazy(path, {.own_weights = false});
      const auto& plan = lazy.plan();
      REQUIRE(plan.token_embd.size() > 1);  // 512 x 64 rows against a layer of ~20K weights
      if (tied) {
        CHECK(plan.output.size() == plan.token_embd.size());
        CHECK(plan.output.front().segment == plan.token_embd.front().segment);
      } else {
        CHECK(plan.output.size() > 1);
      }
      int64_t rows = 0;
      for (const auto& p : plan.token_embd) {
        CHECK(p.row0 == rows);
        CHECK(p.m.view.rows % 16 == 0);
        rows += p.m.view.rows;
      }
      CHECK(rows == owned.config().n_vocab);
      const auto want = greedy(owned, nullptr, 8);
      const uint64_t block = memory::k_default_block_bytes;
      const uint64_t one = (plan.largest_segment() + block - 1) / block * block;
      check_same(run_with_budget(lazy, blocks_of(plan, block), true, 1, 8), want);
      check_same(run_with_budget(lazy, 2 * one, true, 1, 8), want);
      check_same(run_with_budget(lazy, one, false, 0, 8), want);
    }
  }

  TEST_CASE("pipelined: the pass starts while the segments are still landing") {
    const auto path = test::data_path("stories260K-q8_0.gguf").string();
    const models::model owned(path);
    const models::model lazy(path, {.own_weights = false});
    const auto want = greedy(owned, nullptr, 6);
    // A slow link: the load is still in flight when the pass begins; leases wait per segment.
    auto backend = memory::make_cpu_backend(0.002);  // ~0.2 s for the 379 KB of segments
    memory::arbiter a(*backend, {64 << 20, 64 << 20});
    models::arbiter_residency res(a, lazy, "model");
    REQUIRE(a.stage(res.id()).st == memory::status::ok);
    const auto load = a.load(res.id());
    REQUIRE(load.st == memory::status::ok);
    CHECK_FALSE(load.done.ready());
    check_same(greedy(lazy, &res, 6), want);
    CHECK(load.done.ready());
  }
}
