// Completion of asynchronous work (a copy, a staging job): a cheap shared handle that any
// thread may poll or wait on. A default-constructed event is already complete.
#pragma once

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>
#include <vector>

namespace tandem::memory {

class event {
 public:
  // What a backend puts behind an event (a flag set by a copy thread, a CUDA event).
  struct state {
    virtual ~state() = default;
    virtual bool ready() const = 0;
    virtual void wait() const = 0;
    // Makes work queued on a device stream (a cudaStream_t) after this call wait for the
    // event on the device, without blocking the host; false where the backend cannot.
    virtual bool wait_on(void* /*stream*/) const { return false; }
  };

  event() = default;
  explicit event(std::shared_ptr<const state> s) : s_(std::move(s)) {}

  bool ready() const { return !s_ || s_->ready(); }
  void wait() const {
    if (s_) s_->wait();
  }
  // state::wait_on; true for a complete event (nothing to wait for).
  bool wait_on(void* stream) const { return !s_ || s_->wait_on(stream); }

 private:
  std::shared_ptr<const state> s_;
};

// An event completed by a host thread calling signal() (or fail()) once. wait() rethrows the
// error of a failed one.
class host_event final : public event::state {
 public:
  bool ready() const override {
    std::lock_guard lock(m_);
    return done_;
  }
  void wait() const override {
    std::unique_lock lock(m_);
    cv_.wait(lock, [&] { return done_; });
    if (error_) std::rethrow_exception(error_);
  }
  void signal() { finish(nullptr); }
  void fail(std::exception_ptr e) { finish(std::move(e)); }

 private:
  void finish(std::exception_ptr e) {
    {
      std::lock_guard lock(m_);
      error_ = std::move(e);
      done_ = true;
    }
    cv_.notify_all();
  }
  mutable std::mutex m_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  std::exception_ptr error_;
};

// Complete when every one of `events` is.
class all_of_event final : public event::state {
 public:
  explicit all_of_event(std::vector<event> events) : events_(std::move(events)) {}
  bool ready() const override {
    for (const auto& e : events_)
      if (!e.ready()) return false;
    return true;
  }
  void wait() const override {
    for (const auto& e : events_) e.wait();
  }

 private:
  std::vector<event> events_;
};

inline event all_of(std::vector<event> events) {
  if (events.empty()) return {};
  if (events.size() == 1) return events.front();
  return event(std::make_shared<all_of_event>(std::move(events)));
}

}  // namespace tandem::memory
