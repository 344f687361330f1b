// The HTTP load test: many concurrent streaming clients against a live server on loopback,
// some of them hanging up mid-stream, for a fixed time. It counts what completed, what was
// dropped on purpose and what failed (any other outcome: an error status, a cut stream, a
// refused connection), and the streams' throughput and first-token latency; a single client
// run first gives the baseline the aggregate is reported against.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace tandem::bench {

struct http_load_options {
  int clients = 32;
  std::chrono::milliseconds duration{120'000};
  std::chrono::milliseconds baseline{5'000};  // the single-client run before; 0: none
  double disconnect_fraction = 0.25;          // clients that hang up mid-stream on every request
  std::vector<std::string> models;            // requests go round-robin over these
  int64_t max_tokens = 64;
  uint64_t seed = 1;
};

struct http_load_report {
  int clients = 0;
  double seconds = 0;
  int64_t completed = 0;     // streams that ended with [DONE]
  int64_t disconnected = 0;  // streams the client hung up on, on purpose
  int64_t failed = 0;        // everything else
  int64_t rejected = 0;      // 429 / 503 answers (counted in failed too)
  // SSE events received by completing clients (one per generated piece, plus the role and
  // finish chunks): reported as "chunks".
  int64_t chunks = 0;
  double chunks_per_s = 0;
  double baseline_chunks_per_s = 0;  // one client alone
  double ttft_p50_ms = 0, ttft_p99_ms = 0;
  std::vector<std::string> failures;  // the first few, for the report
};

// Runs against 127.0.0.1:port (the server must serve options.models).
http_load_report run_http_load(uint16_t port, const http_load_options& o);
nlohmann::json to_json(const http_load_report& r);
std::string format_table(const http_load_report& r);

}  // namespace tandem::bench
