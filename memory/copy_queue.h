// A FIFO of memcpys run by one thread (the CPU backend's stream of one direction), each
// completing an event; optionally throttled to a byte rate.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <memory>
#include <mutex>
#include <thread>

#include "memory/event.h"

namespace tandem::memory {

class copy_queue {
 public:
  // bytes_per_second > 0 paces each copy so it takes at least bytes / rate seconds.
  explicit copy_queue(double bytes_per_second = 0);
  ~copy_queue();  // finishes what was enqueued, then stops the thread
  copy_queue(const copy_queue&) = delete;
  copy_queue& operator=(const copy_queue&) = delete;

  event enqueue(void* dst, const void* src, size_t bytes);
  void drain();  // waits until every copy enqueued so far has completed

 private:
  struct job {
    void* dst;
    const void* src;
    size_t bytes;
    std::shared_ptr<host_event> done;
  };
  void run();
  void copy(const job& j) const;

  double rate_;
  std::mutex m_;
  std::condition_variable cv_;       // work arrived, or stop
  std::condition_variable idle_cv_;  // the queue emptied
  std::deque<job> jobs_;
  bool busy_ = false;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tandem::memory
