// The caller's side of a request submitted to the engine: a thread-safe stream of generated
// token ids, a way to cancel, and how it ended. The engine thread pushes; any thread reads.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>

namespace tandem::runtime {

enum class finish_reason { none, length, eog, context, cancelled, error };
const char* finish_name(finish_reason r);

class request_handle {
 public:
  // The next generated token, waiting up to `timeout`: true with *token set; false when the
  // request has finished and every token was read (finished() says why), or on timeout.
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

  // Engine side.
  void push(int32_t token);
  void finish(finish_reason why, std::string error = {});

 private:
  mutable std::mutex m_;
  mutable std::condition_variable cv_;
  std::deque<int32_t> tokens_;
  finish_reason done_ = finish_reason::none;
  std::chrono::steady_clock::time_point finished_at_{};
  std::string error_;
  bool cancel_ = false;
};

}  // namespace tandem::runtime
