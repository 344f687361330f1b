#include "bench/swap_bench.h"

#include <chrono>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <vector>

#include "bench/model_bench.h"
#include "kernels/cpu/thread_pool.h"
#include "memory/arbiter.h"
#include "memory/cpu_backend.h"
#include "memory/huge_buffer.h"
#include "memory/kv_pool.h"
#include "models/arbiter_residency.h"
#include "models/forward.h"
#include "models/weight_plan.h"

namespace tandem::bench {
namespace {

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

uint64_t in_blocks(const models::weight_plan& p, size_t block) {
  uint64_t n = 0;
  for (const auto& s : p.segments) n += std::max<uint64_t>(1, (s.bytes + block - 1) / block) * block;
  return n;
}

double ratio(double a, double b) { return b != 0 ? a / b : 0; }

}  // namespace

double swap_bench_result::swap_in_vs_ceiling() const { return ratio(swap_in_gb_s.median, copy_ceiling_gb_s.median); }
double swap_bench_result::pipelined_vs_sequential() const { return ratio(first_token_ms_pipelined.median, first_token_ms_sequential.median); }

swap_bench_result run_swap_bench(const swap_bench_options& o) {
  if (o.prompt < 1 || o.reps < 1) throw std::invalid_argument("bench swap: prompt and reps must be >= 1");
  const models::model m(o.model_path, {.own_weights = false});
  const auto& plan = m.plan();
  const auto& c = m.config();
  swap_bench_result r;
  r.model_path = o.model_path;
  r.bytes = plan.total_bytes();
  r.segments = plan.last_segment() + 1;
  r.prompt = o.prompt;
  r.reps = o.reps;
  r.link_gbps = o.link_gbps;

  auto backend = memory::make_cpu_backend(o.link_gbps);
  r.backend = backend->info().name;
  const auto kv = kernels::cpu::kv_type::f16;
  const int64_t bt = 16, n_ctx = o.prompt + 1;
  const auto block_bytes = static_cast<size_t>(models::kv_bytes_per_token(c, kv) * bt);
  const auto kv_blocks = static_cast<int32_t>((n_ctx + bt - 1) / bt);
  const uint64_t weights = in_blocks(plan, memory::k_default_block_bytes);
  memory::arbiter a(*backend, {weights + static_cast<uint64_t>(kv_blocks) * block_bytes + (4u << 20), weights});
  models::arbiter_residency res(a, m, "bench", 2);
  const auto id = res.id();
  auto pool_kv = memory::kv_pool::make(a, "bench", kv_blocks, bt, block_bytes);
  if (!pool_kv || pool_kv->reserve(0, n_ctx) != memory::status::ok) throw std::logic_error("bench swap: KV pool sizing");
  kernels::cpu::thread_pool pool(o.threads > 0 ? o.threads : kernels::cpu::default_thread_count());
  r.threads = pool.size();
  models::context_params cp;
  cp.n_ctx = n_ctx;
  cp.kv = kv;
  cp.max_batch = std::min<int64_t>(o.prompt, 512);
  cp.kv_pool = pool_kv.get();
  models::forward_context ctx(m, cp, &pool, &res);
  const auto ids = bench_tokens(c.n_vocab, o.prompt, o.seed);
  auto must = [](memory::status s, const char* what) {
    if (s != memory::status::ok) throw std::logic_error(std::string("bench swap: ") + what + ": " + std::string(memory::status_name(s)));
  };
  auto evict_device = [&] { must(a.evict(id, memory::tier::device), "evict device"); };
  auto first_token_ms = [&](bool reload, bool wait) {
    ctx.reset();
    if (reload) evict_device();
    const auto t0 = clock_type::now();
    if (reload) {
      const auto ld = a.load(id);
      must(ld.st, "load");
      if (wait) ld.done.wait();
    }
    ctx.eval(ids);  // the first token's logits are ready when the prompt pass ends
    return seconds_since(t0) * 1e3;
  };

  // Staging from the file (page cache warm after the first pass), then warm-up of both tiers'
  // pages and of the pool.
  std::vector<double> stage, swap_s, swap_gb, ceil_gb, t_res, t_pipe, t_seq;
  for (int rep = 0; rep < o.reps + 1; ++rep) {
    must(a.evict(id, memory::tier::host), "evict host");
    const auto t0 = clock_type::now();
    const auto st = a.stage(id);
    must(st.st, "stage");
    st.done.wait();
    if (rep > 0) stage.push_back(seconds_since(t0));
  }
  {
    const auto ld = a.load(id);
    must(ld.st, "load");
    ld.done.wait();
    ctx.eval({ids.data(), std::min<size_t>(ids.size(), 16)});
    ctx.reset();
  }
  memory::huge_buffer src(r.bytes), dst(r.bytes);
  std::memset(src.data(), 1, r.bytes);
  std::memset(dst.data(), 2, r.bytes);
  for (int rep = 0; rep < o.reps; ++rep) {
    evict_device();
    auto t0 = clock_type::now();
    const auto ld = a.load(id);
    must(ld.st, "load");
    ld.done.wait();
    const double s = seconds_since(t0);
    swap_s.push_back(s);
    swap_gb.push_back(static_cast<double>(r.bytes) / s / 1e9);
    t0 = clock_type::now();
    std::memcpy(dst.data(), src.data(), r.bytes);
    ceil_gb.push_back(static_cast<double>(r.bytes) / seconds_since(t0) / 1e9);
    // The three first-token runs interleaved, so drift on a shared machine hits them alike.
    t_res.push_back(first_token_ms(false, false));
    t_seq.push_back(first_token_ms(true, true));
    t_pipe.push_back(first_token_ms(true, false));
  }
  a.wait_idle(id);
  r.stage_s = summarize(stage);
  r.swap_in_s = summarize(swap_s);
  r.swap_in_gb_s = summarize(swap_gb);
  r.copy_ceiling_gb_s = summarize(ceil_gb);
  r.first_token_ms_resident = summarize(t_res);
  r.first_token_ms_pipelined = summarize(t_pipe);
  r.first_token_ms_sequential = summarize(t_seq);
  std::vector<double> pen, seq_pen;
  for (size_t i = 0; i < t_res.size(); ++i) {
    pen.push_back(t_pipe[i] - t_res[i]);
    seq_pen.push_back(t_seq[i] - t_res[i]);
  }
  r.swap_penalty_ms = summarize(pen);
  r.sequential_penalty_ms = summarize(seq_pen);
  return r;
}

nlohmann::json to_json(const swap_bench_result& r) {
  nlohmann::json j;
  j["model"] = r.model_path;
  j["backend"] = r.backend;
  j["link_gbps"] = r.link_gbps;
  j["link_simulated"] = r.link_gbps > 0;
  j["bytes"] = r.bytes;
  j["segments"] = r.segments;
  j["threads"] = r.threads;
  j["prompt"] = r.prompt;
  j["reps"] = r.reps;
  auto put = [&](const char* name, const summary& s) {
    j[name] = s.median;
    j[std::string(name) + "_min"] = s.min;
    j[std::string(name) + "_max"] = s.max;
  };
  put("stage_s", r.stage_s);
  put("swap_in_s", r.swap_in_s);
  put("swap_in_gb_s", r.swap_in_gb_s);
  put("copy_ceiling_gb_s", r.copy_ceiling_gb_s);
  put("first_token_ms_resident", r.first_token_ms_resident);
  put("first_token_ms_pipelined", r.first_token_ms_pipelined);
  put("first_token_ms_sequential", r.first_token_ms_sequential);
  j["swap_in_vs_ceiling"] = r.swap_in_vs_ceiling();
  j["pipelined_vs_sequential"] = r.pipelined_vs_sequential();
  put("swap_penalty_ms", r.swap_penalty_ms);
  put("sequential_penalty_ms", r.sequential_penalty_ms);
  j["swap_penalty_vs_copy"] = ratio(r.swap_penalty_ms.median, r.swap_in_s.median * 1e3);
  return j;
}

std::string format_table(const swap_bench_result& r) {
  std::string out;
  char line[256];
  auto add = [&](const char* fmt, auto... args) {
    std::snprintf(line, sizeof line, fmt, args...);
    out += line;
  };
  add("model: %s, %.1f MiB in %d segments\n", r.model_path.c_str(), static_cast<double>(r.bytes) / 1048576.0, r.segments);
  if (r.link_gbps > 0)
    add("backend: %s, link %.2f GB/s (simulated)\n", r.backend.c_str(), r.link_gbps);
  else
    add("backend: %s, link not throttled\n", r.backend.c_str());
  add("threads %d, %d reps: median [min .. max]\n", r.threads, r.reps);
  auto row = [&](const char* name, const summary& s, const char* unit, double scale) {
    add("%-30s %10.2f %-5s [%.2f .. %.2f]\n", name, s.median * scale, unit, s.min * scale, s.max * scale);
  };
  row("stage disk -> host", r.stage_s, "ms", 1e3);
  row("swap-in host -> device", r.swap_in_s, "ms", 1e3);
  row("swap-in", r.swap_in_gb_s, "GB/s", 1);
  row("memcpy ceiling", r.copy_ceiling_gb_s, "GB/s", 1);
  add("%-30s %10.2f\n", "swap-in / ceiling", r.swap_in_vs_ceiling());
  std::snprintf(line, sizeof line, "first token, %lld-token prompt", static_cast<long long>(r.prompt));
  out += line;
  out += ":\n";
  row("  resident", r.first_token_ms_resident, "ms", 1);
  row("  after swap-in, pipelined", r.first_token_ms_pipelined, "ms", 1);
  row("  after swap-in, sequential", r.first_token_ms_sequential, "ms", 1);
  add("%-30s %10.2f\n", "pipelined / sequential", r.pipelined_vs_sequential());
  row("swap penalty, pipelined", r.swap_penalty_ms, "ms", 1);
  row("swap penalty, sequential", r.sequential_penalty_ms, "ms", 1);
  add("%-30s %10.2f\n", "penalty / swap-in copy", ratio(r.swap_penalty_ms.median, r.swap_in_s.median * 1e3));
  return out;
}

}  // namespace tandem::bench
