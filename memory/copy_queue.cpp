#include "memory/copy_queue.h"

#include <algorithm>
#include <chrono>
#include <cstring>

namespace tandem::memory {

copy_queue::copy_queue(double bytes_per_second) : rate_(bytes_per_second), thread_([this] { run(); }) {}

copy_queue::~copy_queue() {
  {
    std::lock_guard lock(m_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

event copy_queue::enqueue(void* dst, const void* src, size_t bytes) {
  auto done = std::make_shared<host_event>();
  {
    std::lock_guard lock(m_);
    jobs_.push_back({dst, src, bytes, done});
  }
  cv_.notify_one();
  return event(done);
}

void copy_queue::drain() {
  std::unique_lock lock(m_);
  idle_cv_.wait(lock, [&] { return jobs_.empty() && !busy_; });
}

void copy_queue::copy(const job& j) const {
  if (rate_ <= 0) {
    std::memcpy(j.dst, j.src, j.bytes);
    return;
  }
  // In slices, each released no earlier than the link would have delivered it, so a reader
  // polling the event sees the same latency a PCIe transfer of that size would have.
  constexpr size_t k_slice = size_t{1} << 20;
  const auto start = std::chrono::steady_clock::now();
  for (size_t at = 0; at < j.bytes; at += k_slice) {
    const size_t n = std::min(k_slice, j.bytes - at);
    std::memcpy(static_cast<std::byte*>(j.dst) + at, static_cast<const std::byte*>(j.src) + at, n);
    const auto due = start + std::chrono::duration<double>(static_cast<double>(at + n) / rate_);
    std::this_thread::sleep_until(std::chrono::time_point_cast<std::chrono::steady_clock::duration>(due));
  }
}

void copy_queue::run() {
  for (;;) {
    job j;
    {
      std::unique_lock lock(m_);
      cv_.wait(lock, [&] { return stop_ || !jobs_.empty(); });
      if (jobs_.empty()) return;  // stop_ and nothing left
      j = std::move(jobs_.front());
      jobs_.pop_front();
      busy_ = true;
    }
    if (j.bytes > 0) copy(j);
    j.done->signal();
    {
      std::lock_guard lock(m_);
      busy_ = false;
      if (jobs_.empty()) idle_cv_.notify_all();
    }
  }
}

}  // namespace tandem::memory
