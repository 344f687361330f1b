// The caller's side of a request submitted to the engine: a thread-safe stream of generated
// tokens with the text each releases, a way to cancel, and how it ended. The engine thread
// pushes; any thread reads.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <optional>
#include <string>

#include "runtime/sampler.h"

namespace tandem::runtime {

// stop: a stop string of the request completed (its text is not part of the output).
enum class finish_reason { none, length, eog, stop, context, cancelled, error };
const char* finish_name(finish_reason r);

// One generated token and the text that became final with it: complete UTF-8, less what is
// held back while it may begin a stop string. Text released at the end (held-back text when
// the request finishes) comes as a piece with token -1.
struct piece {
  int32_t token = -1;
  std::string text;
  std::chrono::steady_clock::time_point at{};  // when the engine released it
  std::optional<token_logprob> logprob;        // when the request asked for logprobs (generation_params::logprobs)
};

class request_handle {
 public:
  // The next piece, waiting up to `timeout`: true with *p set; false when the request has
  // finished and everything was read (finished() says why), or on timeout.
  bool next(piece* p, std::chrono::milliseconds timeout = std::chrono::hours(24));
  // The same, token ids only (pieces of text alone are skipped).
  bool next(int32_t* token, std::chrono::milliseconds timeout = std::chrono::hours(24));
  // Asks the engine to stop: the request finishes with `cancelled` within one iteration and
  // its KV is freed. Safe from any thread, at any time, more than once.
  void cancel();
  bool cancel_requested() const;
  finish_reason finished() const;
  // When the engine finished it (the epoch before that): for request durations in logs and
  // metrics, and the order in which requests ended.
  std::chrono::steady_clock::time_point finished_at() const;
  std::string error() const;
  // Waits until the request has finished (tokens left unread stay readable).
  void wait() const;

  // Calls f (on the engine's thread, or here when something is already readable) whenever a
  // piece arrives or the request finishes: for readers that must not block a thread per
  // request (the HTTP server posts to its connection's strand). f must be cheap and must not
  // call back into this handle's push/finish. An empty f removes it.
  void set_notify(std::function<void()> f);

  // Proposed tokens verified for this request so far, and those accepted (speculation): for
  // usage.completion_tokens_details' prediction counts.
  struct speculation_counts {
    int64_t proposed = 0, accepted = 0;
  };
  speculation_counts speculation() const;

  // Engine side.
  void push(int32_t token, std::string text = {}, std::optional<token_logprob> logprob = {});
  void add_speculation(int64_t proposed, int64_t accepted);
  void finish(finish_reason why, std::string error = {});

 private:
  mutable std::mutex m_;
  mutable std::condition_variable cv_;
  std::deque<piece> pieces_;
  finish_reason done_ = finish_reason::none;
  std::chrono::steady_clock::time_point finished_at_{};
  std::string error_;
  bool cancel_ = false;
  speculation_counts spec_;
  std::function<void()> notify_;
};

}  // namespace tandem::runtime
