#include "memory/job_queue.h"

namespace tandem::memory {

job_queue::job_queue() : thread_([this] { run(); }) {}

job_queue::~job_queue() {
  {
    std::lock_guard lock(m_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void job_queue::post(std::function<void()> job) {
  {
    std::lock_guard lock(m_);
    jobs_.push_back(std::move(job));
  }
  cv_.notify_one();
}

void job_queue::run() {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock lock(m_);
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;
      job = std::move(jobs_.front());
      jobs_.pop_front();
    }
    job();
  }
}

}  // namespace tandem::memory
