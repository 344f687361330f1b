#include "bench/bench_report.h"

#include <algorithm>
#include <cstdio>
#include <numeric>

#include "kernels/cpu/isa.h"
#include "kernels/cpu/thread_pool.h"
#include "models/model.h"

namespace tandem::bench {
namespace {

double ratio(double a, double b) { return b != 0 ? a / b : 0.0; }

// a[i] / b[i] for the repetitions both have (a comparison measured beside each repetition).
std::vector<double> pair_ratios(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> out;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) out.push_back(ratio(a[i], b[i]));
  return out;
}
double median_or_zero(const std::vector<double>& v) { return v.empty() ? 0.0 : summarize(v).median; }

void put(nlohmann::json& j, const std::string& name, const summary& s, const std::vector<double>& samples) {
  j[name] = s.median;
  j[name + "_min"] = s.min;
  j[name + "_max"] = s.max;
  j[name + "_samples"] = samples;
}

std::string line(const char* label, const std::string& what, const summary& s, const char* unit, const std::string& note = {}) {
  char buf[256];
  std::snprintf(buf, sizeof buf, "%-9s %-22s %10.2f %-5s [%.2f .. %.2f]  %5.1f%%%s%s\n", label, what.c_str(), s.median, unit, s.min, s.max,
                100.0 * s.spread(), note.empty() ? "" : "  ", note.c_str());
  return buf;
}

}  // namespace

double bench_report::batched_vs_single() const { return ratio(result.batched_decode.median, result.decode_as_batched.median); }
double bench_report::batched_vs_decode() const { return ratio(result.batched_decode.median, result.decode.median); }
double bench_report::decode_vs_ceiling() const {
  if (!decode_vs_ceiling_samples.empty()) return summarize(decode_vs_ceiling_samples).median;
  return ratio(result.decode_gb.median, ceiling.gb_s_summary.median);
}
std::vector<double> bench_report::layer_teams_vs_step_jobs_samples() const {
  return pair_ratios(result.decode_layer_teams_tok_s, result.decode_tok_s);
}
double bench_report::layer_teams_vs_step_jobs() const { return median_or_zero(layer_teams_vs_step_jobs_samples()); }
std::vector<double> bench_report::prefill_server_vs_exact_samples() const { return pair_ratios(result.prefill_tok_s, result.prefill_exact_tok_s); }
double bench_report::prefill_server_vs_exact() const { return median_or_zero(prefill_server_vs_exact_samples()); }
double bench_report::compute_ceiling_tok_s() const { return rows_per_second(dots.gmac_s_summary.median, result.int8_macs_per_token); }
double bench_report::batched_vs_compute_ceiling() const { return ratio(result.batched_decode.median, compute_ceiling_tok_s()); }

namespace {

// Forces the kernels' path for one run and puts the previous one back (set_isa is process-wide).
class isa_scope {
 public:
  isa_scope(kernels::cpu::isa which, bool avx_vnni, bool amx)
      : before_(kernels::cpu::requested_isa()),
        vnni_before_(kernels::cpu::avx_vnni_allowed()),
        amx_before_(kernels::cpu::amx_allowed()),
        forced_(which != kernels::cpu::isa::best) {
    if (!forced_) return;
    kernels::cpu::set_isa(which);
    kernels::cpu::set_avx_vnni(avx_vnni);
    kernels::cpu::set_amx(amx);
  }
  ~isa_scope() {
    if (!forced_) return;
    kernels::cpu::set_isa(before_);
    kernels::cpu::set_avx_vnni(vnni_before_);
    kernels::cpu::set_amx(amx_before_);
  }
  isa_scope(const isa_scope&) = delete;
  isa_scope& operator=(const isa_scope&) = delete;

 private:
  kernels::cpu::isa before_;
  bool vnni_before_;
  bool amx_before_;
  bool forced_;
};

}  // namespace

bench_report run_bench(const bench_options& o) {
  const isa_scope path(o.isa, o.avx_vnni, o.amx);
  models::model m(o.model_path);
  kernels::cpu::thread_pool pool(o.threads > 0 ? o.threads : kernels::cpu::default_thread_count());
  bench_report r;
  r.model_path = o.model_path;
  r.arch = std::string(models::architecture_name(m.config().arch));
  r.type = kernels::display_name(main_weight_type(m));
  r.weight_bytes = m.weight_bytes();
  r.threads = pool.size();
  r.isa = kernels::cpu::active_path_name();
  r.params = o.params;
  {
    // The ceiling's buffer is held through the model phases so that passes can be timed
    // within and right after each decode repetition: on a shared machine the bandwidth moves
    // within a second, and one pass after the repetition saw a spell the decode mostly
    // did not. A repetition's ceiling is the mean of its passes. With the layer-teams
    // comparison the decode runs whole, as the teams' decode beside it does.
    read_ceiling_probe probe(pool, o.read_buffer_bytes > 0 ? o.read_buffer_bytes : default_read_buffer_bytes());
    std::vector<double> paired, within;
    model_bench_params params = o.params;
    if (!params.compare_layer_teams) params.decode_pause_every = k_ceiling_pause_tokens;
    r.result = run_model_bench(
        m, pool, params,
        [&] {
          within.push_back(probe.measure());
          paired.push_back(std::accumulate(within.begin(), within.end(), 0.0) / static_cast<double>(within.size()));
          within.clear();
        },
        [&] { within.push_back(probe.measure()); });
    r.ceiling.buffer_bytes = probe.bytes();
    r.ceiling.gb_s = paired;
    while (r.ceiling.gb_s.size() < static_cast<size_t>(std::max(o.params.reps, 3))) r.ceiling.gb_s.push_back(probe.measure());
    r.ceiling.gb_s_summary = summarize(r.ceiling.gb_s);
    for (size_t i = 0; i < paired.size() && i < r.result.decode_gb_s.size(); ++i)
      r.decode_vs_ceiling_samples.push_back(ratio(r.result.decode_gb_s[i], paired[i]));
  }
  r.dots = measure_dot_ceiling(pool, std::max(o.params.reps, 3));
  return r;
}

nlohmann::json to_json(const bench_report& r) {
  nlohmann::json j;
  j["model"] = r.model_path;
  j["arch"] = r.arch;
  j["type"] = r.type;
  j["weight_bytes"] = r.weight_bytes;
  j["threads"] = r.threads;
  j["isa"] = r.isa;
  j["prompt"] = r.params.prompt;
  j["gen"] = r.params.gen;
  j["batch"] = r.params.batch;
  j["depth"] = r.params.depth;
  j["prompt_attention"] = r.params.fast_prompt_attention ? "fast" : "exact";
  j["decode_attention"] = r.params.fast_decode_attention ? "fast" : "exact";
  j["batched_attention"] = r.params.fast_batched_attention ? "fast" : "exact";
  j["reps"] = r.params.reps;
  put(j, "prefill_tok_s", r.result.prefill, r.result.prefill_tok_s);
  if (r.params.compare_prompt) {
    put(j, "prefill_exact_tok_s", r.result.prefill_exact, r.result.prefill_exact_tok_s);
    j["prefill_server_vs_exact"] = r.prefill_server_vs_exact();
    j["prefill_server_vs_exact_samples"] = r.prefill_server_vs_exact_samples();
  }
  put(j, "decode_tok_s", r.result.decode, r.result.decode_tok_s);
  put(j, "batched_decode_tok_s", r.result.batched_decode, r.result.batched_decode_tok_s);
  put(j, "decode_as_batched_tok_s", r.result.decode_as_batched, r.result.decode_as_batched_tok_s);
  put(j, "decode_gb_s", r.result.decode_gb, r.result.decode_gb_s);
  if (r.params.compare_layer_teams) {
    put(j, "decode_layer_teams_tok_s", r.result.decode_layer_teams, r.result.decode_layer_teams_tok_s);
    j["layer_teams_vs_step_jobs"] = r.layer_teams_vs_step_jobs();
    j["layer_teams_vs_step_jobs_samples"] = r.layer_teams_vs_step_jobs_samples();
  }
  put(j, "read_ceiling_gb_s", r.ceiling.gb_s_summary, r.ceiling.gb_s);
  put(j, "dot_ceiling_gmac_s", r.dots.gmac_s_summary, r.dots.gmac_s);
  j["decode_bytes_per_token"] = r.result.decode_bytes_per_token;
  j["int8_macs_per_token"] = r.result.int8_macs_per_token;
  j["compute_ceiling_tok_s"] = r.compute_ceiling_tok_s();
  j["batched_vs_compute_ceiling"] = r.batched_vs_compute_ceiling();
  j["read_buffer_bytes"] = r.ceiling.buffer_bytes;
  j["batched_vs_single"] = r.batched_vs_single();
  j["batched_vs_decode"] = r.batched_vs_decode();
  j["decode_vs_ceiling"] = r.decode_vs_ceiling();
  j["decode_vs_ceiling_samples"] = r.decode_vs_ceiling_samples;
  return j;
}

std::string format_table(const bench_report& r) {
  const auto& p = r.params;
  char head[512];
  std::snprintf(head, sizeof head, "model: %s (%s, %s, %.1f MiB)\nthreads %d, isa %s, %d reps: median [min .. max] spread\n", r.model_path.c_str(),
                r.arch.c_str(), r.type.c_str(), static_cast<double>(r.weight_bytes) / (1 << 20), r.threads, r.isa.c_str(), p.reps);
  std::string out = head;
  char note[128];
  const std::string at = p.depth > 0 ? " @ " + std::to_string(p.depth) : "";
  // A phase in llama.cpp's arithmetic says so; the server's is the default.
  out += line("prefill", std::to_string(p.prompt) + " tokens" + at, r.result.prefill, "tok/s",
              p.fast_prompt_attention ? "" : "llama.cpp's arithmetic, as `tandem run`");
  if (p.compare_prompt) {
    std::snprintf(note, sizeof note, "the prefill above is %.2fx it, pass by pass", r.prefill_server_vs_exact());
    out += line("prefill", std::to_string(p.prompt) + " tok, llama.cpp's" + at, r.result.prefill_exact, "tok/s", note);
  }
  out += line("decode", std::to_string(p.gen) + " tokens" + at, r.result.decode, "tok/s",
              p.fast_decode_attention ? "" : "llama.cpp's arithmetic, as `tandem run`");
  if (p.compare_layer_teams) {
    std::snprintf(note, sizeof note, "%.3fx the decode above (a job per step), pass by pass", r.layer_teams_vs_step_jobs());
    out += line("decode", std::to_string(p.gen) + " tok, layer teams", r.result.decode_layer_teams, "tok/s", note);
  }
  std::snprintf(note, sizeof note, "%.2fx one sequence alike, %.2fx decode above", r.batched_vs_single(), r.batched_vs_decode());
  out += line("batched", std::to_string(p.batch) + " seqs x " + std::to_string(p.gen) + " tok" + at, r.result.batched_decode, "tok/s", note);
  out += line("alone", "1 seq, as batched" + at, r.result.decode_as_batched, "tok/s",
              p.fast_batched_attention ? "the batched context" : "the batched context, llama.cpp's arithmetic");
  std::snprintf(note, sizeof note, "%.2f of the read ceiling%s", r.decode_vs_ceiling(), r.decode_vs_ceiling_samples.empty() ? "" : ", pass by pass");
  char what[64];
  std::snprintf(what, sizeof what, "%.1f MB/token", static_cast<double>(r.result.decode_bytes_per_token) / 1e6);
  out += line("decode", what, r.result.decode_gb, "GB/s", note);
  std::snprintf(what, sizeof what, "read, %.0f MiB buffer", static_cast<double>(r.ceiling.buffer_bytes) / (1 << 20));
  out += line("ceiling", what, r.ceiling.gb_s_summary, "GB/s");
  if (r.result.int8_macs_per_token > 0) {
    std::snprintf(note, sizeof note, "%.0f tok/s at %.1fM MACs/token; batched %.2f of it", r.compute_ceiling_tok_s(),
                  static_cast<double>(r.result.int8_macs_per_token) / 1e6, r.batched_vs_compute_ceiling());
    out += line("ceiling", "int8 dot", r.dots.gmac_s_summary, "GMAC/s", note);
  }
  return out;
}

}  // namespace tandem::bench
