#include "runtime/request_handle.h"

namespace tandem::runtime {

const char* finish_name(finish_reason r) {
  switch (r) {
    case finish_reason::none: return "running";
    case finish_reason::length: return "length";
    case finish_reason::eog: return "stop";
    case finish_reason::context: return "context";
    case finish_reason::cancelled: return "cancelled";
    case finish_reason::error: return "error";
  }
  return "?";
}

bool request_handle::next(int32_t* token, std::chrono::milliseconds timeout) {
  std::unique_lock lock(m_);
  cv_.wait_for(lock, timeout, [&] { return !tokens_.empty() || done_ != finish_reason::none; });
  if (tokens_.empty()) return false;
  *token = tokens_.front();
  tokens_.pop_front();
  return true;
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

void request_handle::push(int32_t token) {
  {
    std::lock_guard lock(m_);
    tokens_.push_back(token);
  }
  cv_.notify_all();
}

void request_handle::finish(finish_reason why, std::string error) {
  {
    std::lock_guard lock(m_);
    if (done_ != finish_reason::none) return;
    done_ = why;
    finished_at_ = std::chrono::steady_clock::now();
    error_ = std::move(error);
  }
  cv_.notify_all();
}

}  // namespace tandem::runtime
