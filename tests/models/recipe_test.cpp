#include "models/recipe.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <cstddef>
#include <stdexcept>
#include <tuple>
#include <string>
#include <vector>

#include "models/model.h"
#include "models/recipe_runner.h"
#include "models/weight_plan.h"
#include "models/weight_residency.h"
#include "tests/test_support.h"
#include "tests/models/tiny_model.h"

namespace tandem {
namespace {

using models::act;

const char* act_name(act a) {
  static const char* names[] = {"x", "xb", "q", "k", "v", "attn", "gate", "up"};
  return names[static_cast<int>(a)];
}

// A backend that computes nothing and writes down each call, in order.
class recording_backend final : public models::pass_backend, public models::layer_ops {
 public:
  std::vector<std::string> log;
  bool async = false;
  int fail_at_layer = -1;  // run_layer throws for this layer

  void embed(const models::weight_view& t, int64_t row0) override { log.push_back("embed " + std::to_string(row0) + "+" + std::to_string(t.rows)); }
  void run_layer(int64_t layer, models::layer_body body) override {
    if (layer == fail_at_layer) throw std::runtime_error("kernel failure");
    log.push_back("layer " + std::to_string(layer));
    body(*this);
  }
  void output_norm(const float*) override { log.push_back("output_norm"); }
  void head(const models::weight_view& h, int64_t col0) override { log.push_back("head " + std::to_string(col0) + "+" + std::to_string(h.rows)); }
  bool asynchronous() const override { return async; }
  void drain() override { log.push_back("drain"); }
  void mark(int slot) override { log.push_back("mark " + std::to_string(slot)); }
  void wait_mark(int slot) override { log.push_back("wait " + std::to_string(slot)); }

  void norm(act in, const float*, act out) override { op("norm", {in, out}); }
  void matmul(act in, std::initializer_list<models::product> ps) override {
    std::string s = std::string("matmul ") + act_name(in) + " ->";
    for (const auto& p : ps) s += std::string(" ") + act_name(p.out);
    ops.push_back(s);
  }
  void matmul_swiglu(act in, const models::weight_view&, const models::weight_view&, act gate, act up) override { op("swiglu", {in, gate, up}); }
  void add_bias(act a, const float*) override { op("bias", {a}); }
  void head_norm(act a, const float*, int64_t n) override { op("head_norm/" + std::to_string(n), {a}); }
  void rope(act a, int64_t n) override { op("rope/" + std::to_string(n), {a}); }
  void kv_store(int64_t l, act k, act v) override { op("kv_store " + std::to_string(l), {k, v}); }
  void attention(int64_t l, act q, act out) override { op("attention " + std::to_string(l), {q, out}); }
  void add(act dst, act src) override { op("add", {dst, src}); }

  std::vector<std::string> ops;  // the layer ops of every layer, in order

 private:
  void op(const std::string& name, std::initializer_list<act> args) {
    std::string s = name;
    for (const act a : args) s += std::string(" ") + act_name(a);
    ops.push_back(s);
  }
};

// Leases as an arbiter would give them, checked: no segment acquired twice, every one
// released, and the most held at once counted.
class counting_residency final : public models::weight_residency {
 public:
  explicit counting_residency(int segments, int depth) : held_(static_cast<size_t>(segments), 0), depth_(depth) {}
  const std::byte* acquire(int seg) override {
    REQUIRE(held_.at(static_cast<size_t>(seg)) == 0);
    held_[static_cast<size_t>(seg)] = 1;
    ++now_;
    most = std::max(most, now_);
    log.push_back("acquire " + std::to_string(seg));
    return bytes_;
  }
  void release(int seg) override {
    REQUIRE(held_.at(static_cast<size_t>(seg)) == 1);
    held_[static_cast<size_t>(seg)] = 0;
    --now_;
    log.push_back("release " + std::to_string(seg));
  }
  void prefetch(int seg) override { log.push_back("prefetch " + std::to_string(seg)); }
  int prefetch_depth() const override { return depth_; }
  int held() const { return now_; }

  std::vector<std::string> log;
  int most = 0;

 private:
  alignas(64) std::byte bytes_[4096] = {};
  std::vector<int> held_;
  int depth_;
  int now_ = 0;
};

models::model tiny(const std::string& arch, bool bias, bool qk_norm, const test::scratch_dir& dir) {
  test::tiny_model t;
  t.arch = arch;
  t.qkv_bias = bias;
  t.qk_norm = qk_norm;
  t.n_layer = 3;
  const std::string path = (dir / (arch + ".gguf")).string();
  t.write(path);
  return models::model(path, {.pack_weights = false, .own_weights = false});
}

}  // namespace

TEST_SUITE("recipe") {
  TEST_CASE("the llama recipe is the same layer for llama, qwen2 (biases) and qwen3 (q/k norms)") {
    test::scratch_dir dir;
    const std::vector<std::string> llama_layer = {"norm x xb",      "matmul xb -> q k v", "rope/4 q",          "rope/2 k",
                                                  "kv_store 1 k v", "attention 1 q attn", "matmul attn -> xb", "add x xb",
                                                  "norm x xb",      "swiglu xb gate up",  "matmul gate -> xb", "add x xb"};
    for (const auto& [arch, bias, norm] : {std::tuple{"llama", false, false}, {"qwen2", true, false}, {"qwen3", false, true}}) {
      CAPTURE(arch);
      const auto m = tiny(arch, bias, norm, dir);
      const auto& c = m.config();
      const models::recipe& r = models::recipe_for(c);
      CHECK(std::string(r.name) == "llama");
      std::vector<std::byte> seg(m.plan().segments[static_cast<size_t>(m.plan().layer_segment(1))].bytes);
      const models::layer_weights w = models::bind_layer(m.plan().layers[1], seg.data());
      recording_backend b;
      r.layer(b, c, w, 1);
      std::vector<std::string> want = llama_layer;
      if (bias) want.insert(want.begin() + 2, {"bias q", "bias k", "bias v"});
      if (norm) want.insert(want.begin() + 2, {"head_norm/4 q", "head_norm/2 k"});
      CHECK(b.ops == want);
    }
  }

  TEST_CASE("a synchronous backend holds one layer at a time; every lease is released") {
    test::scratch_dir dir;
    const auto m = tiny("llama", false, false, dir);
    const auto& plan = m.plan();
    counting_residency res(plan.last_segment() + 1, 2);
    recording_backend b;
    const std::vector<int32_t> tokens = {1, 2, 3};
    models::run_recipe(models::recipe_for(m.config()), b, m, &res, tokens, true);
    CHECK(res.held() == 0);
    CHECK(res.most == 1);
    CHECK(b.log.front().rfind("embed 0+", 0) == 0);
    CHECK(b.log.back().rfind("head 0+", 0) == 0);
    // Layer l's segment is prefetched before it is acquired.
    const int l0 = plan.layer_segment(0);
    const auto at = [&](const std::string& s) { return std::find(res.log.begin(), res.log.end(), s) - res.log.begin(); };
    CHECK(at("prefetch " + std::to_string(l0)) < at("acquire " + std::to_string(l0)));
    CHECK(at("prefetch " + std::to_string(l0 + 1)) < at("acquire " + std::to_string(l0 + 1)));

    SUBCASE("without logits the head is not leased") {
      counting_residency r2(plan.last_segment() + 1, 0);
      recording_backend b2;
      models::run_recipe(models::recipe_for(m.config()), b2, m, &r2, tokens, false);
      CHECK(r2.held() == 0);
      CHECK(std::find(r2.log.begin(), r2.log.end(), "acquire " + std::to_string(plan.output.front().segment)) == r2.log.end());
      CHECK(std::count(b2.log.begin(), b2.log.end(), "output_norm") == 0);
    }
    SUBCASE("a failing layer leaves nothing leased") {
      counting_residency r3(plan.last_segment() + 1, 2);
      recording_backend b3;
      b3.fail_at_layer = 1;
      CHECK_THROWS_AS(models::run_recipe(models::recipe_for(m.config()), b3, m, &r3, tokens, true), std::runtime_error);
      CHECK(r3.held() == 0);
    }
    SUBCASE("a walk yields between layers, holding nothing there, and not after the last") {
      counting_residency r4(plan.last_segment() + 1, 1);
      recording_backend b4;
      models::run_embedding(b4, m, &r4, tokens);
      models::layer_walk walk(models::recipe_for(m.config()), b4, m, &r4, true);
      int yields = 0;
      while (!walk.advance()) {
        ++yields;
        CHECK(r4.held() == 0);  // the layer went back before other passes may run
      }
      CHECK(yields == m.config().n_layer - 1);
      CHECK(walk.done());
      CHECK(walk.advance());  // done stays done
      CHECK(b4.log.back().rfind("head 0+", 0) == 0);
      CHECK(r4.held() == 0);
    }
    SUBCASE("a walk abandoned midway releases what it holds") {
      counting_residency r5(plan.last_segment() + 1, 1);
      recording_backend b5;
      b5.async = true;
      {
        models::layer_walk walk(models::recipe_for(m.config()), b5, m, &r5, true);
        CHECK_FALSE(walk.advance());
        CHECK(r5.held() >= 1);
      }
      CHECK(r5.held() == 0);
      CHECK(b5.log.back() == "drain");  // the queued layer ran before its segment went back
    }
  }

  TEST_CASE("an asynchronous backend overlaps two layers and releases each after its mark") {
    test::scratch_dir dir;
    const auto m = tiny("llama", false, false, dir);
    const auto& plan = m.plan();
    counting_residency res(plan.last_segment() + 1, 1);
    recording_backend b;
    b.async = true;
    const std::vector<int32_t> tokens = {0};
    models::run_recipe(models::recipe_for(m.config()), b, m, &res, tokens, true);
    CHECK(res.held() == 0);
    CHECK(res.most == 2);
    // After layer 1 ran, layer 0's mark is waited for, not the whole stream.
    const auto l1 = std::find(b.log.begin(), b.log.end(), "layer 1");
    REQUIRE(l1 != b.log.end());
    CHECK(*(l1 + 1) == "mark 1");
    CHECK(*(l1 + 2) == "wait 0");
  }

  TEST_CASE("only the embedding pieces the tokens fall in are leased") {
    test::scratch_dir dir;
    const auto m = tiny("llama", false, false, dir);
    const auto& plan = m.plan();
    counting_residency res(plan.last_segment() + 1, 0);
    recording_backend b;
    models::run_embedding(b, m, &res, std::vector<int32_t>{});
    CHECK(res.log.empty());
    CHECK(b.log.empty());
  }
}

}  // namespace tandem
