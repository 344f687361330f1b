#include "bench/http_load.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <mutex>
#include <random>
#include <thread>

#include "bench/http_client.h"

namespace tandem::bench {

namespace {

using clock_type = std::chrono::steady_clock;

struct tally {
  std::mutex m;
  http_load_report r;
  std::vector<double> ttft_ms;
  void fail(std::string why) {
    std::lock_guard lock(m);
    ++r.failed;
    if (r.failures.size() < 8) r.failures.push_back(std::move(why));
  }
};

const char* const k_prompts[] = {
    "Once upon a time",
    "The little dog ran to the park and",
    "Lily wanted to play with her friends, but",
    "One day, a big red ball rolled down the hill. Tom saw it and",
    "The sun was shining. Sam and his mom went to",
};

// One request: streamed chat or completion; hangs up after `hang_up_after` events when > 0.
void one_request(uint16_t port, const std::string& model, int64_t max_tokens, int hang_up_after, std::mt19937_64& rng, tally& t) {
  const bool chat = rng() % 2 == 0;
  const std::string prompt = k_prompts[rng() % std::size(k_prompts)];
  nlohmann::json body{{"model", model}, {"max_tokens", max_tokens}, {"stream", true}, {"temperature", 0.7}, {"seed", rng() % 1000}};
  if (chat)
    body["messages"] = {{{"role", "user"}, {"content", prompt}}};
  else
    body["prompt"] = prompt;
  try {
    http_conn c(port);
    c.send("POST", chat ? "/v1/chat/completions" : "/v1/completions", body.dump());
    if (hang_up_after > 0) {
      // Read a few events, then close with the rest unread: the server must cancel.
      auto events = [&] {
        int n = 0;
        for (size_t at = c.raw().find("data: "); at != std::string::npos; at = c.raw().find("data: ", at + 1)) ++n;
        return n;
      };
      while (events() < hang_up_after && c.raw().find("data: [DONE]") == std::string::npos)
        if (!c.read_more(std::chrono::seconds(60))) return t.fail("the stream ended before the client hung up");
      std::lock_guard lock(t.m);
      ++t.r.disconnected;
      return;
    }
    const auto reply = c.reply(std::chrono::seconds(300));
    if (reply.status == 429 || reply.status == 503) {
      {
        std::lock_guard lock(t.m);
        ++t.r.rejected;
      }
      return t.fail("status " + std::to_string(reply.status));
    }
    if (reply.status != 200) return t.fail("status " + std::to_string(reply.status) + ": " + reply.body.substr(0, 200));
    if (reply.body.find("data: [DONE]") == std::string::npos) return t.fail("a stream without [DONE]");
    int64_t chunks = 0;
    for (size_t at = reply.body.find("data: {"); at != std::string::npos; at = reply.body.find("data: {", at + 1)) ++chunks;
    std::lock_guard lock(t.m);
    ++t.r.completed;
    t.r.chunks += chunks;
  } catch (const std::exception& e) {
    t.fail(e.what());
  }
}

void run_clients(uint16_t port, const http_load_options& o, int clients, std::chrono::milliseconds d, tally& t) {
  const auto until = clock_type::now() + d;
  const int hangers = static_cast<int>(clients * o.disconnect_fraction + 0.5);
  std::vector<std::thread> threads;
  for (int i = 0; i < clients; ++i)
    threads.emplace_back([&, i] {
      std::mt19937_64 rng(o.seed * 7919 + static_cast<uint64_t>(i));
      size_t next_model = static_cast<size_t>(i);
      while (clock_type::now() < until) {
        const auto& model = o.models[next_model++ % o.models.size()];
        one_request(port, model, o.max_tokens, i < hangers ? 1 + static_cast<int>(rng() % 4) : 0, rng, t);
      }
    });
  for (auto& th : threads) th.join();
}

double percentile(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[static_cast<size_t>(p * static_cast<double>(v.size() - 1) + 0.5)];
}

// First-token latency under the load, sampled by a probe client once a second.
void probe_ttft(uint16_t port, const http_load_options& o, std::chrono::milliseconds d, tally& t) {
  const auto until = clock_type::now() + d;
  size_t k = 0;
  while (clock_type::now() < until) {
    const auto t0 = clock_type::now();
    try {
      http_conn c(port);
      c.send("POST", "/v1/completions",
             nlohmann::json{{"model", o.models[k++ % o.models.size()]}, {"prompt", "Once upon a time"}, {"max_tokens", 4}, {"stream", true}}.dump());
      if (c.read_until("data: ", std::chrono::seconds(60))) {
        std::lock_guard lock(t.m);
        t.ttft_ms.push_back(std::chrono::duration<double, std::milli>(clock_type::now() - t0).count());
      }
      (void)c.reply(std::chrono::seconds(60));
    } catch (const std::exception&) {
      // Counted by the clients' own failures; the probe only times.
    }
    std::this_thread::sleep_until(t0 + std::chrono::seconds(1));
  }
}

}  // namespace

http_load_report run_http_load(uint16_t port, const http_load_options& o) {
  if (o.models.empty()) throw std::invalid_argument("http load: no models to ask");
  http_load_report out;
  if (o.baseline.count() > 0) {
    tally b;
    const auto t0 = clock_type::now();
    http_load_options one = o;
    one.disconnect_fraction = 0;
    run_clients(port, one, 1, o.baseline, b);
    const double s = std::chrono::duration<double>(clock_type::now() - t0).count();
    out.baseline_chunks_per_s = static_cast<double>(b.r.chunks) / s;
  }
  tally t;
  const auto t0 = clock_type::now();
  std::thread probe([&] { probe_ttft(port, o, o.duration, t); });
  run_clients(port, o, o.clients, o.duration, t);
  probe.join();
  out.clients = o.clients;
  out.seconds = std::chrono::duration<double>(clock_type::now() - t0).count();
  out.completed = t.r.completed;
  out.disconnected = t.r.disconnected;
  out.failed = t.r.failed;
  out.rejected = t.r.rejected;
  out.chunks = t.r.chunks;
  out.chunks_per_s = static_cast<double>(t.r.chunks) / out.seconds;
  out.ttft_p50_ms = percentile(t.ttft_ms, 0.5);
  out.ttft_p99_ms = percentile(t.ttft_ms, 0.99);
  out.failures = t.r.failures;
  return out;
}

nlohmann::json to_json(const http_load_report& r) {
  return {{"clients", r.clients},
          {"seconds", r.seconds},
          {"requests_completed", r.completed},
          {"requests_disconnected", r.disconnected},
          {"requests_failed", r.failed},
          {"requests_rejected", r.rejected},
          {"chunks", r.chunks},
          {"chunks_per_s", r.chunks_per_s},
          {"baseline_chunks_per_s", r.baseline_chunks_per_s},
          {"vs_single_client", r.baseline_chunks_per_s > 0 ? r.chunks_per_s / r.baseline_chunks_per_s : 0.0},
          {"ttft_p50_ms", r.ttft_p50_ms},
          {"ttft_p99_ms", r.ttft_p99_ms},
          {"failures", r.failures}};
}

std::string format_table(const http_load_report& r) {
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "clients %d for %.1f s: %lld completed, %lld hung up on purpose, %lld failed (%lld rejected)\n"
                "streamed %lld chunks, %.1f/s (one client alone: %.1f/s, x%.2f); probe TTFT p50 %.1f ms, p99 %.1f ms\n",
                r.clients, r.seconds, static_cast<long long>(r.completed), static_cast<long long>(r.disconnected), static_cast<long long>(r.failed),
                static_cast<long long>(r.rejected), static_cast<long long>(r.chunks), r.chunks_per_s, r.baseline_chunks_per_s,
                r.baseline_chunks_per_s > 0 ? r.chunks_per_s / r.baseline_chunks_per_s : 0.0, r.ttft_p50_ms, r.ttft_p99_ms);
  std::string out = buf;
  for (const auto& f : r.failures) out += "  failure: " + f + "\n";
  return out;
}

}  // namespace tandem::bench
