#include "bench/gpu_bench.h"

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <type_traits>

#include "bench/stats.h"
#include "kernels/device_probe.h"

#if defined(TANDEM_HAVE_CUDA)
#include <chrono>
#include <cstring>
#include <memory>

#include "bench/model_bench.h"
#include "kernels/cuda/bandwidth.h"
#include "kernels/cuda/runtime.h"
#include "memory/arbiter.h"
#include "memory/cuda_backend.h"
#include "models/arbiter_residency.h"
#include "models/cuda/gpu_forward.h"
#include "models/model.h"
#include "models/weight_plan.h"
#endif

namespace tandem::bench {
namespace {

double ratio(double a, double b) { return b != 0 ? a / b : 0.0; }

#if defined(TANDEM_HAVE_CUDA)

using clock_type = std::chrono::steady_clock;
double seconds_since(clock_type::time_point t0) { return std::chrono::duration<double>(clock_type::now() - t0).count(); }

double median_of(const std::vector<double>& v) { return summarize(v).median; }
double best_of(const std::vector<double>& v) { return summarize(v).max; }

// What the arbiter's tiers must hold for every segment: each rounded up to whole blocks.
uint64_t in_blocks(const models::weight_plan& p, size_t block) {
  uint64_t n = 0;
  for (const auto& s : p.segments) n += std::max<uint64_t>(1, (s.bytes + block - 1) / block) * block;
  return n;
}

int32_t greedy(std::span<const float> logits) { return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin()); }

void must(memory::status s, const char* what) {
  if (s != memory::status::ok) throw std::logic_error(std::string("bench gpu: ") + what + ": " + std::string(memory::status_name(s)));
}

// Host -> device copy figures, on buffers of their own (freed before the arbiter allocates
// its tiers): the plain-copy ceiling and the backend's per-segment copies.
void measure_h2d(memory::backend& b, const models::weight_plan& plan, int reps, gpu_bench_figures& f) {
  const auto bytes = static_cast<size_t>(f.model_bytes);
  auto host = b.allocate(memory::tier::host, bytes);
  auto dev = b.allocate(memory::tier::device, bytes);
  std::memset(host->data(), 1, bytes);
  kernels::cuda::stream s;
  using kernels::cuda::copy_path;
  kernels::cuda::time_copy_s(copy_path::host_to_device, dev->data(), host->data(), bytes, s.get());  // warm-up
  std::vector<double> ceiling;
  for (int i = 0; i < std::max(reps, 3); ++i)
    ceiling.push_back(static_cast<double>(bytes) / kernels::cuda::time_copy_s(copy_path::host_to_device, dev->data(), host->data(), bytes, s.get()) /
                      1e9);
  f.memcpy_ceiling_gb_s = best_of(ceiling);
  // As the arbiter's loader thread: one backend copy per segment, each waited for before the
  // next is issued, so the per-copy latency counts as it does in a swap-in.
  std::vector<double> chunked;
  for (int rep = 0; rep < reps + 1; ++rep) {
    const auto t0 = clock_type::now();
    size_t off = 0;
    for (const auto& seg : plan.segments) {
      b.copy(memory::copy_kind::host_to_device, dev->data() + off, host->data() + off, seg.bytes).wait();
      off += seg.bytes;
    }
    if (rep > 0) chunked.push_back(static_cast<double>(off) / seconds_since(t0) / 1e9);
  }
  f.pinned_h2d_gb_s = median_of(chunked);
}

// The device-to-device copy bandwidth: a buffer at least the model's size (and 256 MiB, so
// the copy outlasts the event resolution by far) copied whole; each byte read and written.
void measure_d2d(uint64_t model_bytes, int reps, gpu_bench_figures& f) {
  const size_t bytes = std::max<size_t>(static_cast<size_t>(model_bytes), size_t{256} << 20);
  kernels::cuda::device_buffer src(bytes), dst(bytes);
  kernels::cuda::stream s;
  kernels::cuda::fill_bytes(src.get(), 1, bytes, s.get());
  using kernels::cuda::copy_path;
  kernels::cuda::time_copy_s(copy_path::device_to_device, dst.get(), src.get(), bytes, s.get());  // warm-up
  std::vector<double> gb;
  for (int i = 0; i < std::max(reps, 3); ++i)
    gb.push_back(2.0 * static_cast<double>(bytes) / kernels::cuda::time_copy_s(copy_path::device_to_device, dst.get(), src.get(), bytes, s.get()) /
                 1e9);
  f.d2d_gb_s = best_of(gb);
}

// The arbiter on the CUDA backend, both tiers sized for the whole model: the swap-in from the
// host tier, then the first token after a swap-in with the load waited for or not.
void measure_swap(memory::backend& b, const models::model& m, const gpu_bench_options& o, const std::vector<int32_t>& ids, gpu_bench_figures& f) {
  const uint64_t weights = in_blocks(m.plan(), memory::k_default_block_bytes);
  memory::arbiter a(b, {weights, weights});
  models::arbiter_residency res(a, m, "bench", 2);
  const auto id = res.id();
  const auto st = a.stage(id);
  must(st.st, "stage");
  st.done.wait();
  std::vector<double> swap_s;
  for (int rep = 0; rep < o.reps + 1; ++rep) {
    must(a.evict(id, memory::tier::device), "evict device");
    const auto t0 = clock_type::now();
    const auto ld = a.load(id);
    must(ld.st, "load");
    ld.done.wait();
    if (rep > 0) swap_s.push_back(seconds_since(t0));
  }
  f.swap_in_s = median_of(swap_s);
  f.swap_in_gb_s = ratio(static_cast<double>(f.model_bytes), f.swap_in_s) / 1e9;

  models::gpu_context_params cp;
  cp.n_ctx = o.prompt + 1;
  cp.max_batch = std::min<int64_t>(o.prompt, 512);
  models::gpu_forward fwd(m, cp, &res);
  // Pipelined: each layer's acquire waits only for its own segment, so compute starts when
  // the embedding lands. Sequential: the whole load first. The first token is picked on the
  // CPU in both, as a server would.
  auto first_token_ms = [&](bool wait_for_load) {
    fwd.reset();
    must(a.evict(id, memory::tier::device), "evict device");
    const auto t0 = clock_type::now();
    const auto ld = a.load(id);
    must(ld.st, "load");
    if (wait_for_load) ld.done.wait();
    fwd.eval(ids);
    (void)greedy(fwd.logits());
    return seconds_since(t0) * 1e3;
  };
  first_token_ms(false);  // warm-up: first launches, the cuBLAS handle's workspace
  std::vector<double> pipelined, sequential;
  for (int rep = 0; rep < o.reps; ++rep) {  // interleaved, so drift hits both alike
    sequential.push_back(first_token_ms(true));
    pipelined.push_back(first_token_ms(false));
  }
  a.wait_idle(id);
  f.first_token_ms_pipelined = median_of(pipelined);
  f.first_token_ms_sequential = median_of(sequential);
}

// Prefill and greedy decode with the weights uploaded by gpu_forward itself (resident).
void measure_resident(const models::model& m, const gpu_bench_options& o, const std::vector<int32_t>& ids, gpu_bench_figures& f) {
  models::gpu_context_params cp;
  cp.n_ctx = std::max(o.prompt, o.gen) + 1;
  cp.max_batch = std::min<int64_t>(o.prompt, 512);
  models::gpu_forward fwd(m, cp);
  fwd.eval(ids);  // warm-up at full size: cuBLAS picks (and lazily loads) per shape
  fwd.reset();
  fwd.eval({ids.data(), 1});
  fwd.reset();
  std::vector<double> prefill, decode;
  for (int rep = 0; rep < o.reps; ++rep) {
    fwd.reset();
    const auto t0 = clock_type::now();
    fwd.eval(ids);
    (void)greedy(fwd.logits());
    prefill.push_back(static_cast<double>(o.prompt) / seconds_since(t0));
  }
  // As llama-bench's tg test, from an empty sequence; each token the argmax of the last
  // logits, so the device -> host copy of the logits is part of every step.
  for (int rep = 0; rep < o.reps; ++rep) {
    fwd.reset();
    int32_t tok = ids[0];
    const auto t0 = clock_type::now();
    for (int64_t i = 0; i < o.gen; ++i) {
      fwd.eval({&tok, 1});
      tok = greedy(fwd.logits());
    }
    decode.push_back(static_cast<double>(o.gen) / seconds_since(t0));
  }
  f.decode_cuda_graphs = fwd.graphs_enabled();
  f.prefill_tok_s = median_of(prefill);
  f.decode_tok_s = median_of(decode);
  f.decode_gb_s = static_cast<double>(f.decode_bytes_per_token) * f.decode_tok_s / 1e9;
}

gpu_bench_figures measure(const gpu_bench_options& o, const std::string& device) {
  // File layout (the CUDA kernels read it), weights viewed in the mapping: segments are
  // filled from the file into the arbiter's host tier, or uploaded by gpu_forward.
  const models::model m(o.model_path, {.pack_weights = false, .own_weights = false});
  const auto& plan = m.plan();
  gpu_bench_figures f;
  f.device = device;
  f.model = o.model_path;
  f.type = kernels::display_name(main_weight_type(m));
  f.model_bytes = plan.total_bytes();
  f.decode_bytes_per_token = decode_weight_bytes(m);
  f.segments = plan.last_segment() + 1;
  f.prompt = o.prompt;
  f.gen = o.gen;
  f.reps = o.reps;
  std::string why;
  auto backend = memory::make_cuda_backend(&why);
  if (!backend) throw std::runtime_error("bench gpu: " + why);
  const auto ids = bench_tokens(m.config().n_vocab, o.prompt, o.seed);
  // One phase at a time, each freeing its memory before the next allocates.
  measure_h2d(*backend, plan, o.reps, f);
  measure_d2d(f.model_bytes, o.reps, f);
  measure_swap(*backend, m, o, ids, f);
  measure_resident(m, o, ids, f);
  return f;
}

#endif  // TANDEM_HAVE_CUDA

// ---- JSON ------------------------------------------------------------------------------

const nlohmann::json& field(const nlohmann::json& j, const char* key) {
  if (!j.is_object()) throw std::invalid_argument("bench gpu: a run's figures must be a JSON object");
  const auto it = j.find(key);
  if (it == j.end()) throw std::invalid_argument(std::string("bench gpu: the figures lack '") + key + "'");
  return *it;
}

template <class T>
void read(const nlohmann::json& j, const char* key, T& out) {
  const auto& v = field(j, key);
  if constexpr (std::is_same_v<T, std::string>) {
    if (!v.is_string()) throw std::invalid_argument(std::string("bench gpu: '") + key + "' must be a string");
  } else if constexpr (std::is_integral_v<T>) {
    const bool ok = v.is_number_integer() && (!std::is_unsigned_v<T> || v.is_number_unsigned() || v.get<int64_t>() >= 0);
    if (!ok) throw std::invalid_argument(std::string("bench gpu: '") + key + "' must be a whole number" + (std::is_unsigned_v<T> ? " >= 0" : ""));
  } else {
    if (!v.is_number()) throw std::invalid_argument(std::string("bench gpu: '") + key + "' must be a number");
  }
  out = v.get<T>();
}

// ---- table -----------------------------------------------------------------------------

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string run_name(const std::string& path) {
  auto name = std::filesystem::path(path).filename().string();
  if (name.size() > 5 && name.ends_with(".gguf")) name.resize(name.size() - 5);
  return name.empty() ? path : name;
}

}  // namespace

double gpu_bench_figures::swap_in_vs_ceiling() const { return ratio(swap_in_gb_s, memcpy_ceiling_gb_s); }
double gpu_bench_figures::decode_vs_roofline() const { return ratio(decode_gb_s, d2d_gb_s); }
double gpu_bench_figures::pipelined_vs_sequential() const { return ratio(first_token_ms_pipelined, first_token_ms_sequential); }

std::vector<std::string> gpu_targets_missed(const gpu_bench_figures& f) {
  std::vector<std::string> missed;
  if (f.swap_in_vs_ceiling() < k_swap_in_target) missed.emplace_back("swap-in");
  if (f.type == "Q4_K" && f.decode_vs_roofline() < k_q4k_decode_target) missed.emplace_back("decode");
  return missed;
}

std::string gpu_bench_unavailable() {
  // Without CUDA the probe says "built without CUDA (...)"; with it, the driver's reason.
  const auto p = kernels::probe_cuda();
  if (p.built && !p.devices.empty()) return {};
  return p.reason.empty() ? std::string("no CUDA device answered") : p.reason;
}

gpu_bench_figures run_gpu_bench(const gpu_bench_options& o) {
  if (o.prompt < 1 || o.gen < 1 || o.reps < 1) throw std::invalid_argument("bench gpu: prompt, gen and reps must be >= 1");
  const auto why = gpu_bench_unavailable();
  if (!why.empty()) throw std::runtime_error("bench gpu: " + why);
#if defined(TANDEM_HAVE_CUDA)
  return measure(o, kernels::probe_cuda().devices.front().name);
#else
  throw std::runtime_error("bench gpu: built without CUDA");  // not reached: the probe says so above
#endif
}

nlohmann::json to_json(const gpu_bench_figures& f) {
  nlohmann::json j;
  j["device"] = f.device;
  j["model"] = f.model;
  j["type"] = f.type;
  j["model_bytes"] = f.model_bytes;
  j["decode_bytes_per_token"] = f.decode_bytes_per_token;
  j["segments"] = f.segments;
  j["prompt"] = f.prompt;
  j["gen"] = f.gen;
  j["reps"] = f.reps;
  j["pinned_h2d_gb_s"] = f.pinned_h2d_gb_s;
  j["memcpy_ceiling_gb_s"] = f.memcpy_ceiling_gb_s;
  j["swap_in_s"] = f.swap_in_s;
  j["swap_in_gb_s"] = f.swap_in_gb_s;
  j["first_token_ms_pipelined"] = f.first_token_ms_pipelined;
  j["first_token_ms_sequential"] = f.first_token_ms_sequential;
  j["prefill_tok_s"] = f.prefill_tok_s;
  j["decode_tok_s"] = f.decode_tok_s;
  j["decode_gb_s"] = f.decode_gb_s;
  j["d2d_gb_s"] = f.d2d_gb_s;
  j["decode_cuda_graphs"] = f.decode_cuda_graphs;
  j["swap_in_vs_ceiling"] = f.swap_in_vs_ceiling();
  j["decode_vs_roofline"] = f.decode_vs_roofline();
  j["pipelined_vs_sequential"] = f.pipelined_vs_sequential();
  return j;
}

gpu_bench_figures gpu_figures_from_json(const nlohmann::json& j) {
  gpu_bench_figures f;
  read(j, "device", f.device);
  read(j, "model", f.model);
  read(j, "type", f.type);
  read(j, "model_bytes", f.model_bytes);
  read(j, "decode_bytes_per_token", f.decode_bytes_per_token);
  read(j, "segments", f.segments);
  read(j, "prompt", f.prompt);
  read(j, "gen", f.gen);
  read(j, "reps", f.reps);
  read(j, "pinned_h2d_gb_s", f.pinned_h2d_gb_s);
  read(j, "memcpy_ceiling_gb_s", f.memcpy_ceiling_gb_s);
  read(j, "swap_in_s", f.swap_in_s);
  read(j, "swap_in_gb_s", f.swap_in_gb_s);
  read(j, "first_token_ms_pipelined", f.first_token_ms_pipelined);
  read(j, "first_token_ms_sequential", f.first_token_ms_sequential);
  read(j, "prefill_tok_s", f.prefill_tok_s);
  read(j, "decode_tok_s", f.decode_tok_s);
  read(j, "decode_gb_s", f.decode_gb_s);
  read(j, "d2d_gb_s", f.d2d_gb_s);
  // Absent from figures written before it was added.
  if (const auto it = j.find("decode_cuda_graphs"); it != j.end()) {
    if (!it->is_boolean()) throw std::invalid_argument("bench gpu: 'decode_cuda_graphs' must be true or false");
    f.decode_cuda_graphs = it->get<bool>();
  }
  return f;
}

std::string format_gpu_table(std::span<const gpu_bench_figures> runs) {
  if (runs.empty()) return "no runs\n";
  // Rows of cells, one cell per run, laid out once every cell is known so each column is as
  // wide as its widest cell.
  struct row {
    std::string label, unit;
    std::vector<std::string> cells;
  };
  std::vector<row> rows;
  auto add = [&](std::string label, std::string unit, auto cell_of) {
    row r{std::move(label), std::move(unit), {}};
    for (const auto& f : runs) r.cells.push_back(cell_of(f));
    rows.push_back(std::move(r));
  };
  using F = const gpu_bench_figures&;
  auto num = [](const char* f, double v) { return fmt(f, v); };
  add("", "", [](F f) { return run_name(f.model); });
  add("device", "", [](F f) { return f.device; });
  add("type", "", [](F f) { return f.type; });
  add("weights", "MiB", [&](F f) { return num("%.1f", static_cast<double>(f.model_bytes) / (1 << 20)); });
  add("segments", "", [](F f) { return std::to_string(f.segments); });
  add("prompt / gen", "tokens", [](F f) { return std::to_string(f.prompt) + " / " + std::to_string(f.gen); });
  add("reps (medians; ceilings: best)", "", [](F f) { return std::to_string(f.reps); });
  add("pinned H2D, a copy per segment", "GB/s", [&](F f) { return num("%.2f", f.pinned_h2d_gb_s); });
  add("memcpy ceiling, pinned", "GB/s", [&](F f) { return num("%.2f", f.memcpy_ceiling_gb_s); });
  add("swap-in, arbiter", "ms", [&](F f) { return num("%.2f", f.swap_in_s * 1e3); });
  add("swap-in", "GB/s", [&](F f) { return num("%.2f", f.swap_in_gb_s); });
  add(fmt("swap-in / ceiling (>= %.2f)", k_swap_in_target), "", [&](F f) { return num("%.2f", f.swap_in_vs_ceiling()); });
  add("first token, pipelined", "ms", [&](F f) { return num("%.2f", f.first_token_ms_pipelined); });
  add("first token, sequential", "ms", [&](F f) { return num("%.2f", f.first_token_ms_sequential); });
  add("pipelined / sequential", "", [&](F f) { return num("%.2f", f.pipelined_vs_sequential()); });
  add("prefill", "tok/s", [&](F f) { return num("%.1f", f.prefill_tok_s); });
  add("decode", "tok/s", [&](F f) { return num("%.1f", f.decode_tok_s); });
  add("decode from CUDA graphs", "", [](F f) { return std::string(f.decode_cuda_graphs ? "yes" : "no"); });
  add("decode weight reads", "GB/s", [&](F f) { return num("%.1f", f.decode_gb_s); });
  add("d2d copy roofline", "GB/s", [&](F f) { return num("%.1f", f.d2d_gb_s); });
  add(fmt("decode / roofline (Q4_K >= %.2f)", k_q4k_decode_target), "", [&](F f) { return num("%.2f", f.decode_vs_roofline()); });
  add("targets", "", [](F f) {
    const auto missed = gpu_targets_missed(f);
    if (missed.empty()) return std::string("met");
    std::string s = "missed:";
    for (const auto& m : missed) s += " " + m;
    return s;
  });

  size_t label_w = 0, unit_w = 0;
  std::vector<size_t> col_w(runs.size(), 0);
  for (const auto& r : rows) {
    label_w = std::max(label_w, r.label.size());
    unit_w = std::max(unit_w, r.unit.size());
    for (size_t c = 0; c < r.cells.size(); ++c) col_w[c] = std::max(col_w[c], r.cells[c].size());
  }
  std::string out;
  for (const auto& r : rows) {
    std::string line = r.label + std::string(label_w - r.label.size(), ' ') + "  " + r.unit + std::string(unit_w - r.unit.size(), ' ');
    for (size_t c = 0; c < r.cells.size(); ++c) line += "  " + std::string(col_w[c] - r.cells[c].size(), ' ') + r.cells[c];
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

std::string format_gpu_table(const gpu_bench_figures& f) { return format_gpu_table(std::span<const gpu_bench_figures>(&f, 1)); }

uint64_t llama_parameters(const llama_shape& s) {
  if (s.dim < 1 || s.layers < 0 || s.heads < 1 || s.kv_heads < 0 || s.ffn < 1 || s.vocab < 1 || s.dim % s.heads != 0)
    throw std::invalid_argument("llama_parameters: dimensions must be positive and dim a multiple of heads");
  const auto n = [](int64_t v) { return static_cast<uint64_t>(v); };
  const uint64_t head_dim = n(s.dim / s.heads);
  const uint64_t kv_dim = n(s.kv_heads > 0 ? s.kv_heads : s.heads) * head_dim;
  const uint64_t d = n(s.dim);
  // wq and wo are d x d; wk and wv d x kv_dim; gate, up and down d x ffn; two norms of d.
  const uint64_t layer = 2 * d * d + 2 * d * kv_dim + 3 * d * n(s.ffn) + 2 * d;
  return n(s.vocab) * d * (s.tied ? 1 : 2) + d + n(s.layers) * layer;
}

}  // namespace tandem::bench
