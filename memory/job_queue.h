// One worker thread running jobs in the order they were posted: the arbiter's stager (disk ->
// host fills) and loader (host -> device copies) are one each, so staging segment i+1 overlaps
// copying segment i.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>

namespace tandem::memory {

class job_queue {
 public:
  job_queue();
  ~job_queue();  // runs what was posted, then stops
  job_queue(const job_queue&) = delete;
  job_queue& operator=(const job_queue&) = delete;

  // The job must not throw: it reports failure through what it captures.
  void post(std::function<void()> job);

 private:
  void run();
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> jobs_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace tandem::memory
