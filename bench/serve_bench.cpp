#include "bench/serve_bench.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <memory>
#include <thread>
#include <vector>

#include "bench/dot_ceiling.h"
#include "bench/model_bench.h"
#include "kernels/cpu/thread_pool.h"
#include "models/model.h"
#include "models/tokenizer.h"
#include "runtime/engine.h"

namespace tandem::bench {
namespace {

using clock_type = std::chrono::steady_clock;
double ms_since(clock_type::time_point t0) { return std::chrono::duration<double, std::milli>(clock_type::now() - t0).count(); }

double pct(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(v.size())));
  return v[std::min(v.size(), std::max<size_t>(rank, 1)) - 1];
}

runtime::generation_params greedy(int64_t n) {
  runtime::generation_params g;
  g.max_tokens = n;
  g.sampling.temperature = 0;
  g.stop_at_eog = false;
  return g;
}

// Token arrival times of one request, from its submission.
struct timed {
  std::shared_ptr<runtime::request_handle> h;
  clock_type::time_point submitted;
  std::vector<double> at_ms;
};

void read_all(std::vector<timed>& rs) {
  std::vector<std::thread> readers;
  for (auto& r : rs)
    readers.emplace_back([&r] {
      int32_t t = 0;
      while (r.h->next(&t)) r.at_ms.push_back(ms_since(r.submitted));
    });
  for (auto& t : readers) t.join();
}

}  // namespace

serve_bench_result run_serve_bench(const serve_bench_options& o) {
  const models::model m(o.model_path);
  const auto tok = models::tokenizer::from_gguf(m.file());
  std::unique_ptr<models::model> high_model;
  std::unique_ptr<models::tokenizer> high_tok;
  if (!o.high_path.empty()) {
    high_model = std::make_unique<models::model>(o.high_path);
    high_tok = std::make_unique<models::tokenizer>(models::tokenizer::from_gguf(high_model->file()));
  }
  const models::model& hm = high_model ? *high_model : m;
  const models::tokenizer& ht = high_tok ? *high_tok : tok;
  const int64_t vocab = m.config().n_vocab;
  const auto ids = bench_tokens(vocab, o.long_prompt + 4096, 7);
  auto prompt = [&](int64_t offset, int64_t n) { return std::vector<int32_t>(ids.begin() + offset, ids.begin() + offset + n); };
  const int64_t ctx = std::max<int64_t>(o.long_prompt + o.gen + 64, 1024);

  runtime::engine_config ec;
  ec.threads = o.threads;
  ec.max_batch_tokens = o.max_batch_tokens;
  ec.prefill_chunk = o.prefill_chunk;
  ec.itl_budget = o.itl_budget;
  ec.itl_target = std::chrono::duration<double, std::milli>(o.itl_target_ms);
  runtime::engine e({{"low", &m, &tok, 0, 16, ctx}, {"high", &hm, &ht, 100, 4, 1024}}, ec);
  serve_bench_result r;
  r.threads = o.threads > 0 ? o.threads : kernels::cpu::default_thread_count();

  // Warm-up: faults in the weights, wakes the pool.
  e.submit({"low", prompt(0, 16), greedy(4)})->wait();
  e.submit({"high", prompt(0, 16), greedy(4)})->wait();

  // Decode at 1, 4, 16 streams: tokens after every stream's first token, over that window.
  // Rounds interleave the concurrencies, so each ratio compares runs seconds apart.
  auto decode_run = [&](int c) {
    std::vector<timed> rs;
    const auto t0 = clock_type::now();
    for (int i = 0; i < c; ++i) rs.push_back({e.submit({"low", prompt(100 + i * 17, 16), greedy(o.gen)}), t0, {}});
    read_all(rs);
    double start = 0, end = 0;
    int64_t tokens = 0;
    for (const auto& x : rs) start = std::max(start, x.at_ms.empty() ? 0 : x.at_ms.front());
    for (const auto& x : rs) {
      end = std::max(end, x.at_ms.empty() ? 0 : x.at_ms.back());
      for (const double t : x.at_ms) tokens += t > start ? 1 : 0;
    }
    return end > start ? static_cast<double>(tokens) / ((end - start) / 1e3) : 0.0;
  };
  std::map<int, std::vector<double>> rounds;
  std::vector<double> ratios;
  for (int rep = 0; rep < std::max(1, o.reps); ++rep) {
    for (const int c : {1, 4, 16}) rounds[c].push_back(decode_run(c));
    if (rounds[1].back() > 0) ratios.push_back(rounds[16].back() / rounds[1].back());
  }
  for (const auto& [c, v] : rounds) {
    r.decode_rounds[c] = summarize(v);
    r.decode_tok_s[c] = r.decode_rounds[c].median;
    r.per_stream_tok_s[c] = r.decode_tok_s[c] / c;
  }
  r.decode_16_vs_1 = summarize(ratios);

  // Inter-token latency of 4 streams while a long prompt is prefilled, then of the same 4
  // streams on their own over the same token positions: the streams' contexts grow as they
  // run, and that must not count against the prefill.
  int64_t k_first = 0, k_last = 0;
  auto itl = [&](bool with_prefill) {
    std::vector<timed> rs;
    const auto t0 = clock_type::now();
    // With a prefill, the streams run until its first token, then are cancelled.
    const int64_t n = with_prefill ? ctx - 32 : k_last + 1;
    for (int i = 0; i < 4; ++i) rs.push_back({e.submit({"low", prompt(300 + i * 23, 16), greedy(n)}), t0, {}});
    timed big{};
    double from = 0, to = 1e300;
    std::thread reader;
    if (with_prefill) {
      std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the streams are decoding
      big = {e.submit({"low", prompt(1000, o.long_prompt), greedy(1)}), clock_type::now(), {}};
      from = ms_since(t0);
      reader = std::thread([&] {
        int32_t t = 0;
        while (big.h->next(&t)) big.at_ms.push_back(ms_since(big.submitted));
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
        for (auto& x : rs) x.h->cancel();
      });
    }
    read_all(rs);
    if (reader.joinable()) reader.join();
    std::vector<double> gaps;
    if (with_prefill) {
      r.long_prompt_ttft_ms = big.at_ms.empty() ? 0 : big.at_ms.front();
      to = from + r.long_prompt_ttft_ms;
      k_first = std::numeric_limits<int64_t>::max();
      for (const auto& x : rs)
        for (size_t k = 1; k < x.at_ms.size(); ++k)
          if (x.at_ms[k] > from && x.at_ms[k - 1] < to) {
            gaps.push_back(x.at_ms[k] - x.at_ms[k - 1]);
            k_first = std::min<int64_t>(k_first, static_cast<int64_t>(k));
            k_last = std::max<int64_t>(k_last, static_cast<int64_t>(k));
          }
      if (gaps.empty()) k_first = k_last = 1;
    } else {
      for (const auto& x : rs)
        for (size_t k = static_cast<size_t>(k_first); k <= static_cast<size_t>(k_last) && k < x.at_ms.size(); ++k)
          gaps.push_back(x.at_ms[k] - x.at_ms[k - 1]);
    }
    return gaps;
  };
  // The long prompt on the idle engine first: what the streams beside it cost it. Its tokens
  // start where no other prompt does, so no cached prefix shortens it.
  {
    timed alone{e.submit({"low", prompt(2, o.long_prompt), greedy(1)}), clock_type::now(), {}};
    std::vector<timed> v{alone};
    read_all(v);
    r.long_prompt_ttft_ms_alone = v[0].at_ms.empty() ? 0 : v[0].at_ms.front();
  }
  const auto busy = itl(true);
  r.itl_p50_ms_during_prefill = pct(busy, 0.5);
  r.itl_p99_ms_during_prefill = pct(busy, 0.99);
  const auto idle = itl(false);
  r.itl_p50_ms_idle = pct(idle, 0.5);
  r.itl_p99_ms_idle = pct(idle, 0.99);
  r.itl_tokens_from = k_first;
  r.itl_tokens_to = k_last;

  // A burst of 4 short high-priority requests: idle, then against 8 long low-priority generations.
  auto burst = [&](bool contended) {
    std::vector<timed> bg;
    const auto t0 = clock_type::now();
    if (contended) {
      for (int i = 0; i < 8; ++i) bg.push_back({e.submit({"low", prompt(2000 + i * 31, 64), greedy(o.gen * 4)}), t0, {}});
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    std::vector<timed> rs;
    const auto t1 = clock_type::now();
    for (int i = 0; i < 4; ++i) rs.push_back({e.submit({"high", prompt(500 + i * 13, 32), greedy(8)}), t1, {}});
    read_all(rs);
    for (auto& b : bg) b.h->cancel();
    e.drain();
    std::vector<double> ttft;
    for (const auto& x : rs) ttft.push_back(x.at_ms.empty() ? 0 : x.at_ms.front());
    return pct(ttft, 0.5);
  };
  r.burst_ttft_ms_idle = burst(false);
  r.burst_ttft_ms_contended = burst(true);

  // Prefix cache: a 512-token prompt, then another with the same first 480 tokens.
  auto ttft_of = [&](std::vector<int32_t> p) {
    timed x{e.submit({"low", std::move(p), greedy(1)}), clock_type::now(), {}};
    std::vector<timed> v{x};
    read_all(v);
    return v[0].at_ms.empty() ? 0.0 : v[0].at_ms.front();
  };
  auto shared = prompt(3000, 480);
  auto a = shared, b = shared;
  const auto tail_a = prompt(3500, 32), tail_b = prompt(3600, 32);
  a.insert(a.end(), tail_a.begin(), tail_a.end());
  b.insert(b.end(), tail_b.begin(), tail_b.end());
  r.prefix_miss_ttft_ms = ttft_of(a);
  r.prefix_hit_ttft_ms = ttft_of(b);

  // Interleaving, on a roster engine of its own.
  interleave_bench_options io;
  io.low_path = o.model_path;
  io.high_path = o.high_path;
  io.threads = o.threads;
  io.low_prompt = std::min<int64_t>(1024, std::max<int64_t>(64, o.long_prompt / 3));
  r.interleave_low_prompt = io.low_prompt;
  r.interleave = run_interleave_bench(io);

  // What the matrices could do at most, measured last: the engines are idle by now.
  r.int8_macs_per_token = decode_int8_macs(m);
  kernels::cpu::thread_pool pool(r.threads > 0 ? r.threads : kernels::cpu::default_thread_count());
  r.dot_ceiling_gmac_s = measure_dot_ceiling(pool, 3).gmac_s_summary.median;
  return r;
}

nlohmann::json to_json(const serve_bench_result& r, const serve_bench_options& o) {
  nlohmann::json j;
  j["model"] = o.model_path;
  j["threads"] = r.threads;
  j["prefill_chunk"] = o.prefill_chunk;
  j["max_batch_tokens"] = o.max_batch_tokens;
  nlohmann::json d = nlohmann::json::object(), ps = nlohmann::json::object();
  for (const auto& [c, v] : r.decode_tok_s) d[std::to_string(c)] = v;
  for (const auto& [c, v] : r.per_stream_tok_s) ps[std::to_string(c)] = v;
  j["decode_tok_s"] = d;
  j["per_stream_tok_s"] = ps;
  nlohmann::json spread = nlohmann::json::object();
  for (const auto& [c, v] : r.decode_rounds) spread[std::to_string(c)] = {v.min, v.max};
  j["decode_tok_s_min_max"] = spread;
  j["decode_rounds"] = r.decode_16_vs_1.count;
  j["decode_16_vs_1"] = r.decode_16_vs_1.median;
  j["decode_16_vs_1_min_max"] = {r.decode_16_vs_1.min, r.decode_16_vs_1.max};
  j["itl_p50_ms_idle"] = r.itl_p50_ms_idle;
  j["itl_p99_ms_idle"] = r.itl_p99_ms_idle;
  j["itl_p50_ms_during_prefill"] = r.itl_p50_ms_during_prefill;
  j["itl_p99_ms_during_prefill"] = r.itl_p99_ms_during_prefill;
  j["itl_p99_ratio"] = r.itl_p99_ms_idle > 0 ? r.itl_p99_ms_during_prefill / r.itl_p99_ms_idle : 0;
  j["itl_token_positions"] = {r.itl_tokens_from, r.itl_tokens_to};
  j["itl_budget"] = o.itl_budget;
  j["long_prompt_tokens"] = o.long_prompt;
  j["long_prompt_ttft_ms"] = r.long_prompt_ttft_ms;
  j["long_prompt_ttft_ms_alone"] = r.long_prompt_ttft_ms_alone;
  j["long_prompt_ttft_vs_alone"] = r.long_prompt_ttft_ms_alone > 0 ? r.long_prompt_ttft_ms / r.long_prompt_ttft_ms_alone : 0;
  j["itl_target_ms"] = o.itl_target_ms;
  j["burst_ttft_ms_idle"] = r.burst_ttft_ms_idle;
  j["burst_ttft_ms_contended"] = r.burst_ttft_ms_contended;
  j["prefix_hit_ttft_ms"] = r.prefix_hit_ttft_ms;
  j["prefix_miss_ttft_ms"] = r.prefix_miss_ttft_ms;
  j["interleave_low_prompt_tokens"] = r.interleave_low_prompt;
  j["interleave_low_pass_ms"] = r.interleave.low_pass_ms;
  j["interleave_high_ttft_ms"] = r.interleave.high_ttft_ms_interleaved;
  j["no_interleave_high_ttft_ms"] = r.interleave.high_ttft_ms_waiting;
  j["interleaved_passes"] = r.interleave.interleaved_passes;
  j["dot_ceiling_gmac_s"] = r.dot_ceiling_gmac_s;
  j["int8_macs_per_token"] = r.int8_macs_per_token;
  j["compute_ceiling_tok_s"] = r.compute_ceiling_tok_s();
  j["decode_16_vs_compute_ceiling"] =
      r.decode_tok_s.count(16) && r.compute_ceiling_tok_s() > 0 ? r.decode_tok_s.at(16) / r.compute_ceiling_tok_s() : 0;
  return j;
}

std::string format_table(const serve_bench_result& r, const serve_bench_options& o) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof line, "model %s, threads %d, prefill chunk %lld, %lld rows per pass\n", o.model_path.c_str(), r.threads,
                static_cast<long long>(o.prefill_chunk), static_cast<long long>(o.max_batch_tokens));
  out += line;
  for (const auto& [c, v] : r.decode_tok_s) {
    const summary& s = r.decode_rounds.at(c);
    std::snprintf(line, sizeof line, "decode, %2d streams      %9.1f tok/s aggregate (%.1f..%.1f), %7.1f per stream\n", c, v, s.min, s.max,
                  r.per_stream_tok_s.at(c));
    out += line;
  }
  std::snprintf(line, sizeof line, "16 streams / 1 stream    %9.2fx (median of %lld rounds' ratios, %.2f..%.2f)\n", r.decode_16_vs_1.median,
                static_cast<long long>(r.decode_16_vs_1.count), r.decode_16_vs_1.min, r.decode_16_vs_1.max);
  out += line;
  if (r.compute_ceiling_tok_s() > 0) {
    std::snprintf(line, sizeof line, "int8 compute ceiling      %9.1f tok/s (%.0f GMAC/s over %.1fM MACs per token)\n", r.compute_ceiling_tok_s(),
                  r.dot_ceiling_gmac_s, static_cast<double>(r.int8_macs_per_token) / 1e6);
    out += line;
  }
  std::snprintf(line, sizeof line, "ITL idle (tokens %lld..%lld) p50 %7.1f ms  p99 %7.1f ms\n", static_cast<long long>(r.itl_tokens_from),
                static_cast<long long>(r.itl_tokens_to), r.itl_p50_ms_idle, r.itl_p99_ms_idle);
  out += line;
  std::snprintf(line, sizeof line, "ITL during %lld-token prefill  p50 %7.1f ms  p99 %7.1f ms (that prompt's TTFT %.0f ms, alone %.0f ms)\n",
                static_cast<long long>(o.long_prompt), r.itl_p50_ms_during_prefill, r.itl_p99_ms_during_prefill, r.long_prompt_ttft_ms,
                r.long_prompt_ttft_ms_alone);
  out += line;
  std::snprintf(line, sizeof line, "burst TTFT (high priority)  idle %7.1f ms  against 8 long generations %7.1f ms\n", r.burst_ttft_ms_idle,
                r.burst_ttft_ms_contended);
  out += line;
  std::snprintf(line, sizeof line, "TTFT 512-token prompt      prefix miss %7.1f ms  hit %7.1f ms\n", r.prefix_miss_ttft_ms, r.prefix_hit_ttft_ms);
  out += line;
  std::snprintf(line, sizeof line, "high-priority TTFT during a %lld-token low-priority pass (%.0f ms)  interleaved %7.1f ms  waiting %7.1f ms\n",
                static_cast<long long>(r.interleave_low_prompt), r.interleave.low_pass_ms, r.interleave.high_ttft_ms_interleaved,
                r.interleave.high_ttft_ms_waiting);
  out += line;
  return out;
}

}  // namespace tandem::bench
