// The CUDA forward pass on a real device: greedy tokens equal to the CPU backend's on the test
// models (F32, Q8_0, and synthetic Q4_K / Q6_K / Q4_0 / Q5_K / BF16 ones), batched decode equal to
// one sequence at a time, and a layer-streamed run (an arbiter with the CUDA backend and about
// one layer of device memory) equal bit for bit to the resident run. Suites named "gpu*" run as
// their own CTest entry (models_gpu), which reports "skipped" (exit 77) where no device answers.
#include <doctest/doctest.h>

#include <cstdlib>
#include <iostream>

#if defined(TANDEM_HAVE_CUDA)

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "kernels/cpu/thread_pool.h"
#include "kernels/cuda/runtime.h"
#include "memory/arbiter.h"
#include "memory/cuda_backend.h"
#include "models/arbiter_residency.h"
#include "models/cuda/gpu_forward.h"
#include "models/forward.h"
#include "models/synth.h"
#include "models/weight_plan.h"
#include "tests/test_support.h"

using namespace tandem;

namespace {

bool device_or_skip() {
  std::string why;
  if (kernels::cuda::device_available(&why)) return true;
  if (std::getenv("TANDEM_GPU_ENTRY")) {
    std::cerr << "SKIPPED: " << why << "\n";
    std::exit(77);
  }
  MESSAGE("skipped: " << why);
  return false;
}

const std::vector<int32_t> k_prompt = {1, 403, 407, 261, 378, 432, 300, 301, 302, 11, 12};  // 11 tokens

struct run_result {
  std::vector<int32_t> tokens;
  std::vector<std::vector<float>> logits;  // after the prompt and after each generated token
};

int32_t argmax(std::span<const float> v) { return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin()); }

// The 11-token prompt is one pass through the cuBLAS GEMM path (more than
// k_matvec_max_rows rows); each generated token goes through the quantized matvec.
template <class Ctx>
run_result greedy(Ctx& ctx, int n_gen, const std::vector<int32_t>& prompt = k_prompt) {
  run_result out;
  ctx.eval(prompt);
  for (int i = 0; i < n_gen; ++i) {
    const auto lg = ctx.logits();
    out.logits.emplace_back(lg.begin(), lg.end());
    const int32_t tok = argmax(lg);
    out.tokens.push_back(tok);
    ctx.eval({&tok, 1});
  }
  return out;
}

run_result cpu_greedy(const models::model& m, int n_gen, const std::vector<int32_t>& prompt = k_prompt) {
  kernels::cpu::thread_pool pool(2);
  models::forward_context ctx(m, {.n_ctx = 64, .kv = kernels::cpu::kv_type::f32, .max_batch = 16}, &pool);
  return greedy(ctx, n_gen, prompt);
}

run_result gpu_greedy(const models::model& m, int n_gen, models::weight_residency* res = nullptr, const std::vector<int32_t>& prompt = k_prompt,
                      bool graphs = true) {
  models::gpu_forward ctx(m, {.n_ctx = 64, .n_seq = 1, .max_batch = 16, .kv = kernels::cpu::kv_type::f32, .cuda_graphs = graphs}, res);
  return greedy(ctx, n_gen, prompt);
}

// Largest |a - b| over the row, relative to the largest |b|.
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0, scale = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    d = std::max(d, std::abs(static_cast<double>(a[i]) - b[i]));
    scale = std::max(scale, std::abs(static_cast<double>(b[i])));
  }
  return scale > 0 ? d / scale : d;
}

// Greedy tokens must agree; logits within `tol` of the CPU's. For quantized weights both
// devices quantize activations to 8 bits in blocks of 32, each its own way (the CPU's Q8_0
// keeps an f16 scale, the GPU's matvec_q8 an f32 one; cuBLAS prefill takes f16), so two
// independent roundings separate them, and the tolerance depends on the weight type.
void check_close(const run_result& gpu, const run_result& cpu, double tol) {
  CHECK(gpu.tokens == cpu.tokens);
  REQUIRE(gpu.logits.size() == cpu.logits.size());
  double worst = 0;
  for (size_t i = 0; i < gpu.logits.size(); ++i) {
    CAPTURE(i);
    CHECK(rel_diff(gpu.logits[i], cpu.logits[i]) <= tol);
    worst = std::max(worst, rel_diff(gpu.logits[i], cpu.logits[i]));
  }
  MESSAGE("logits within " << worst << " of the CPU's (bound " << tol << ")");
}

// The GPU fed the CPU's greedy tokens (so one near-tie cannot make the runs diverge): every
// step's logits within `tol` of the CPU's, and the GPU's top token one the CPU rates within
// the same tolerance of its own top.
void check_forced(const models::model& gpu_model, const run_result& cpu, double tol) {
  models::gpu_forward ctx(gpu_model, {.n_ctx = 64, .n_seq = 1, .max_batch = 16, .kv = kernels::cpu::kv_type::f32});
  ctx.eval(k_prompt);
  for (size_t i = 0; i < cpu.tokens.size(); ++i) {
    CAPTURE(i);
    const auto lg = ctx.logits();
    const std::vector<float> got(lg.begin(), lg.end());
    const auto& want = cpu.logits[i];
    CHECK(rel_diff(got, want) <= tol);
    double scale = 0;
    for (const float v : want) scale = std::max(scale, std::abs(static_cast<double>(v)));
    const auto top = static_cast<size_t>(argmax(got));
    CHECK(want[static_cast<size_t>(cpu.tokens[i])] - want[top] <= tol * scale);
    const int32_t tok = cpu.tokens[i];
    ctx.eval({&tok, 1});
  }
}

std::string write_synth(const test::scratch_dir& dir, kernels::weight_type t) {
  models::synth_options o;
  o.dim = 256;
  o.layers = 2;
  o.heads = 4;
  o.kv_heads = 2;
  o.ffn = 512;
  o.context = 128;
  o.vocab_path = test::data_path("stories260K.gguf").string();
  o.type = t;
  o.seed = 11;
  const auto path = (dir / ("synth-" + std::string(kernels::info(t).name) + ".gguf")).string();
  models::synth_model(o, path);
  return path;
}

}  // namespace

TEST_SUITE("gpu_forward") {
  TEST_CASE("the test models: greedy tokens and logits as on the CPU") {
    if (!device_or_skip()) return;
    for (const char* file : {"stories260K.gguf", "stories260K-q8_0.gguf"}) {
      CAPTURE(file);
      const auto path = test::data_path(file).string();
      const models::model cpu_model(path);
      const models::model gpu_model(path, {.pack_weights = false});
      check_close(gpu_greedy(gpu_model, 24), cpu_greedy(cpu_model, 24), std::string(file).find("q8") != std::string::npos ? 3e-2 : 1e-4);
    }
  }

  TEST_CASE("synthetic models of every CUDA weight type follow the CPU's greedy tokens") {
    if (!device_or_skip()) return;
    test::scratch_dir dir;
    using wt = kernels::weight_type;
    for (const wt t : {wt::f16, wt::bf16, wt::q8_0, wt::q4_0, wt::q4_k, wt::q5_k, wt::q6_k}) {
      CAPTURE(kernels::display_name(t));
      const auto path = write_synth(dir, t);
      const models::model cpu_model(path);
      const models::model gpu_model(path, {.pack_weights = false});
      // Random weights give flat logits, where the activation-precision difference may pick
      // another of two near-equal tokens: compare step by step on the CPU's tokens.
      check_forced(gpu_model, cpu_greedy(cpu_model, 6), 5e-2);
    }
  }

  TEST_CASE("decode replayed from CUDA graphs equals decode launched kernel by kernel, bit for bit") {
    if (!device_or_skip()) return;
    test::scratch_dir dir;
    for (const auto& path : {test::data_path("stories260K.gguf").string(), write_synth(dir, kernels::weight_type::q4_k)}) {
      CAPTURE(path);
      const models::model m(path, {.pack_weights = false});
      const auto with = gpu_greedy(m, 10, nullptr, k_prompt, true);
      const auto without = gpu_greedy(m, 10, nullptr, k_prompt, false);
      CHECK(with.tokens == without.tokens);
      REQUIRE(with.logits.size() == without.logits.size());
      for (size_t i = 0; i < with.logits.size(); ++i) CHECK(with.logits[i] == without.logits[i]);
    }
  }

  TEST_CASE("batched decode equals one sequence at a time") {
    if (!device_or_skip()) return;
    const models::model m(test::data_path("stories260K.gguf").string(), {.pack_weights = false});
    const std::vector<std::vector<int32_t>> prompts = {{1, 403, 407}, {1, 261, 378, 432, 300}, {1, 11}};
    std::vector<run_result> alone;
    for (const auto& p : prompts) alone.push_back(gpu_greedy(m, 8, nullptr, p));

    models::gpu_forward ctx(m, {.n_ctx = 64, .n_seq = 3, .max_batch = 16, .kv = kernels::cpu::kv_type::f32});
    std::vector<int32_t> next(3);
    for (int64_t s = 0; s < 3; ++s) {
      ctx.eval(prompts[static_cast<size_t>(s)], s);
      next[static_cast<size_t>(s)] = argmax(ctx.logits());
    }
    const std::vector<int64_t> seqs = {0, 1, 2};
    std::vector<std::vector<int32_t>> got(3);
    for (int step = 0; step < 8; ++step) {
      for (size_t s = 0; s < 3; ++s) got[s].push_back(next[s]);
      ctx.decode(next, seqs);
      const auto rows = ctx.all_logits_rows();
      for (size_t s = 0; s < 3; ++s)
        next[s] = argmax(rows.subspan(s * static_cast<size_t>(m.config().n_vocab), static_cast<size_t>(m.config().n_vocab)));
    }
    for (size_t s = 0; s < 3; ++s) CHECK(got[s] == alone[s].tokens);
  }

  TEST_CASE("layer-streamed through an arbiter with about one layer of VRAM equals the resident run") {
    if (!device_or_skip()) return;
    std::string why;
    auto backend = memory::make_cuda_backend(&why);
    REQUIRE_MESSAGE(backend, why);
    const models::model m(test::data_path("stories260K.gguf").string(), {.pack_weights = false, .own_weights = false});
    const auto want = gpu_greedy(m, 12);
    const auto& plan = m.plan();
    const uint64_t block = memory::k_default_block_bytes;
    uint64_t all = 0;
    for (const auto& s : plan.segments) all += (s.bytes + block - 1) / block * block;
    const uint64_t one_layer = (plan.largest_segment() + block - 1) / block * block;
    for (const int depth : {0, 2}) {
      CAPTURE(depth);
      memory::arbiter a(*backend, {one_layer * static_cast<uint64_t>(depth + 1), all});
      models::arbiter_residency res(a, m, "model", depth);
      REQUIRE(a.stage(res.id()).st == memory::status::ok);
      REQUIRE(a.reserve_stream_slots(res.id(), depth + 1) == memory::status::ok);
      REQUIRE(res.prepare_streaming() == memory::status::ok);
      const auto got = gpu_greedy(m, 12, &res);
      CHECK(got.tokens == want.tokens);
      REQUIRE(got.logits.size() == want.logits.size());
      for (size_t i = 0; i < got.logits.size(); ++i) CHECK(got.logits[i] == want.logits[i]);
      a.check_integrity();
    }
  }

  TEST_CASE("bad input is refused before any work") {
    if (!device_or_skip()) return;
    const models::model packed(test::data_path("stories260K-q8_0.gguf").string());
    CHECK_THROWS_AS(models::gpu_forward(packed, {.n_ctx = 64}), std::invalid_argument);
    const models::model m(test::data_path("stories260K.gguf").string(), {.pack_weights = false});
    models::gpu_forward ctx(m, {.n_ctx = 16, .n_seq = 2, .max_batch = 8});
    const std::vector<int32_t> bad = {1, 100000};
    CHECK_THROWS_AS(ctx.eval(bad), std::invalid_argument);
    CHECK(ctx.pos() == 0);
    const std::vector<int32_t> long_prompt(17, 1);
    CHECK_THROWS_AS(ctx.eval(long_prompt), std::invalid_argument);
    const std::vector<int32_t> two = {1, 1};
    const std::vector<int64_t> same = {0, 0};
    CHECK_THROWS_AS(ctx.decode(two, same), std::invalid_argument);
  }
}

#else

TEST_SUITE("gpu_forward") {
  TEST_CASE("built without CUDA") {
    if (std::getenv("TANDEM_GPU_ENTRY")) {
      std::cerr << "SKIPPED: built without the CUDA backend\n";
      std::exit(77);
    }
    MESSAGE("skipped: built without the CUDA backend");
  }
}

#endif
