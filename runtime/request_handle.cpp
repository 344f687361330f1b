#include "runtime/request_handle.h"

namespace tandem::runtime {

const char* finish_name(finish_reason r) {
  switch (r) {
    case finish_reason::none:
      return "running";
    case finish_reason::length:
      return "length";
    case finish_reason::eog:
      return "stop";
    case finish_reason::stop:
      return "stop";
    case finish_reason::context:
      return "context";
    case finish_reason::cancelled:
      return "cancelled";
    case finish_reason::error:
      return "error";
  }
  return "?";
}

bool request_handle::next(piece* p, std::chrono::milliseconds timeout) {
  std::unique_lock lock(m_);
  cv_.wait_for(lock, timeout, [&] { return !pieces_.empty() || done_ != finish_reason::none; });
  if (pieces_.empty()) return false;
  *p = std::move(pieces_.front());
  pieces_.pop_front();
  return true;
}

bool request_handle::next(int32_t* token, std::chrono::milliseconds timeout) {
  const auto until = std::chrono::steady_clock::now() + timeout;
  std::unique_lock lock(m_);
  for (;;) {
    if (!cv_.wait_until(lock, until, [&] { return !pieces_.empty() || done_ != finish_reason::none; })) return false;
    if (pieces_.empty()) return false;
    const piece p = std::move(pieces_.front());
    pieces_.pop_front();
    if (p.token >= 0) {
      *token = p.token;
      return true;
    }
  }
}

void request_handle::cancel() {
  std::lock_guard lock(m_);
  cancel_ = true;
}

bool request_handle::cancel_requested() const {
  std::lock_guard lock(m_);
  return cancel_;
}

finish_reason request_handle::finished() const {
  std::lock_guard lock(m_);
  return done_;
}

std::chrono::steady_clock::time_point request_handle::finished_at() const {
  std::lock_guard lock(m_);
  return finished_at_;
}

std::string request_handle::error() const {
  std::lock_guard lock(m_);
  return error_;
}

void request_handle::wait() const {
  std::unique_lock lock(m_);
  cv_.wait(lock, [&] { return done_ != finish_reason::none; });
}

void request_handle::set_notify(std::function<void()> f) {
  bool now = false;
  {
    std::lock_guard lock(m_);
    notify_ = f;
    now = notify_ && (!pieces_.empty() || done_ != finish_reason::none);
  }
  if (now) f();
}

void request_handle::push(int32_t token, std::string text, std::optional<token_logprob> logprob) {
  std::function<void()> f;
  {
    std::lock_guard lock(m_);
    pieces_.push_back({token, std::move(text), std::chrono::steady_clock::now(), std::move(logprob)});
    f = notify_;
  }
  cv_.notify_all();
  if (f) f();
}

void request_handle::finish(finish_reason why, std::string error) {
  std::function<void()> f;
  {
    std::lock_guard lock(m_);
    if (done_ != finish_reason::none) return;
    done_ = why;
    finished_at_ = std::chrono::steady_clock::now();
    error_ = std::move(error);
    f = std::move(notify_);  // nothing follows the end: drop what the callback holds
    notify_ = nullptr;
  }
  cv_.notify_all();
  if (f) f();
}

request_handle::speculation_counts request_handle::speculation() const {
  std::lock_guard lock(m_);
  return spec_;
}

void request_handle::add_speculation(int64_t proposed, int64_t accepted) {
  std::lock_guard lock(m_);
  spec_.proposed += proposed;
  spec_.accepted += accepted;
}

}  // namespace tandem::runtime
