// Fixed pool of worker threads for splitting one kernel call across cores.
#pragma once

#include <cstdint>
#include <functional>

namespace tandem::kernels::cpu {

// Owns n-1 worker threads; the calling thread is the n-th worker, so a pool of 1 runs
// everything inline. parallel_for blocks until every chunk has run; calls from several
// threads at once are serialized. Threads persist for the pool's life (no per-call spawn).
class thread_pool {
 public:
  explicit thread_pool(int threads);
  ~thread_pool();
  thread_pool(const thread_pool&) = delete;
  thread_pool& operator=(const thread_pool&) = delete;

  int size() const;
  // Splits [0, n) into contiguous chunks of at least `grain` items (one chunk, run on the
  // caller, when n < 2 * grain), at most one per thread, sizes differing by at most one:
  // body(begin, end). Chunk c always runs on thread c (0 = the caller), so a given (n, grain,
  // size()) splits the same way every time. The first exception a chunk throws is rethrown
  // here after all chunks end. A nested call on the same pool runs inline on its thread.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t begin, int64_t end)>& body);

 private:
  struct impl;
  impl* impl_;
};

// Threads to use by default: the number of cores this process may run on.
int default_thread_count();

}  // namespace tandem::kernels::cpu
