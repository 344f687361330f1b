#include "kernels/cpu/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace tandem::kernels::cpu {
namespace {

// The pools whose chunks this thread is running now, innermost first: a linked list of
// frames on the stack, one per running chunk. A parallel_for on any pool in the list runs
// inline, since its job cannot finish until this thread's current chunk returns. A list
// rather than one marker, so that after pool B runs inside a chunk of pool A, A is still
// known to be running (B's frame restores A's on exit), and so that A inside B inside A
// is caught as well.
struct running_frame {
  const void* pool;
  const running_frame* outer;
};
thread_local const running_frame* t_running = nullptr;

// Pushes a frame for the duration of one chunk; pops it on exit, exception or not.
class running_scope {
 public:
  explicit running_scope(const void* pool) : frame_{pool, t_running} { t_running = &frame_; }
  ~running_scope() { t_running = frame_.outer; }
  running_scope(const running_scope&) = delete;
  running_scope& operator=(const running_scope&) = delete;

 private:
  running_frame frame_;
};

bool running_on_this_thread(const void* pool) {
  for (const running_frame* f = t_running; f; f = f->outer)
    if (f->pool == pool) return true;
  return false;
}

// Spin iterations a worker polls for the next job before sleeping: a decode step issues
// hundreds of small matmuls back to back, and a condition-variable wakeup each time would
// cost more than the work. Kept short so idle pools do not burn a shared CPU.
constexpr int k_spin_iterations = 2000;

// A job is cut into shares, one per participant, and each share into pieces. A participant
// runs the pieces of its own share front to back, so each core reads one sequential stream
// per product and each claim touches a counter on the core's own cache line. Then it takes
// the pieces of other shares that nobody has started: on a shared machine one core often runs
// slower for a while (another tenant, an interrupt), and with a fixed share per thread the
// other core would wait for it at every call. The pieces halve toward the end of each share,
// so what is left to take, and the wait of a thread that finishes first, are small.
// A single queue of shrinking pieces over the whole range interleaved the two cores' pieces
// and moved one counter between them at every claim: two threads' decode of the 250M
// synthetic Q4_0 model read 68 GB/s of weights with it and 77 with shares, in-process A/B
// alternating every 16 tokens, where two cores could read ~84.
constexpr int64_t k_max_participants = 128;
constexpr int64_t k_max_share_pieces = 64;
constexpr int64_t k_max_pieces = k_max_share_pieces * k_max_participants;

// Share i is items [n * i / participants, n * (i + 1) / participants) (computed without the
// product, which could overflow), and its pieces are [bounds[p], bounds[p + 1]) for p in
// [first[i], first[i + 1]): half of what is left of the share each, never under grain; a
// remainder under grain joins the piece before it (at most k_max_share_pieces a share, the
// last taking what is left). Depends on n, grain and participants only. participants <=
// n / grain, so every share holds at least one grain.
void plan_pieces(int64_t n, int64_t grain, int64_t participants, int64_t* bounds, int64_t* first) {
  auto share_start = [&](int64_t i) { return n / participants * i + n % participants * i / participants; };
  int64_t k = 0;
  for (int64_t i = 0; i < participants; ++i) {
    first[i] = k;
    const int64_t end = share_start(i + 1);
    for (int64_t cur = share_start(i); cur < end;) {
      bounds[k++] = cur;
      const int64_t rest = end - cur;
      int64_t size = std::max(grain, rest / 2);
      if (rest - size < grain || k - first[i] == k_max_share_pieces) size = rest;
      cur += size;
    }
  }
  first[participants] = k;
  bounds[k] = n;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

struct thread_pool::impl {
  int threads = 1;
  std::vector<std::thread> workers;

  std::mutex submit_mutex;  // one parallel_for at a time per pool

  // The current job. body, the pieces and the cursors are written before job_word is published
  // (release) and are only read by the workers that job_word names as participants; the job
  // cannot end, and the next one cannot overwrite them, until each participant has finished.
  const range_fn* body = nullptr;
  int64_t bounds[k_max_pieces + 1] = {};
  int64_t first_piece[k_max_participants + 1] = {};  // share i: pieces [first_piece[i], first_piece[i + 1])
  // Share i's next untaken piece, on a cache line of its own: its participant's claims stay on
  // that core until another thread comes to take what is left.
  struct alignas(64) share_cursor {
    std::atomic<int64_t> next{0};
    int64_t end = 0;
  };
  share_cursor cursors[k_max_participants];
  // generation << 16 | participant count, in one word so a worker that wakes late never pairs
  // one job's generation with another job's participant count.
  std::atomic<uint64_t> job_word{0};
  std::atomic<int> pending{0};  // participating workers not yet done with the job
  std::exception_ptr error;     // first exception thrown by a worker chunk
  std::mutex error_mutex;

  std::mutex wake_mutex;
  std::condition_variable wake;  // workers sleep here between jobs
  std::condition_variable done;  // the submitter sleeps here until pending == 0
  bool stopping = false;

  void shutdown() {
    {
      std::lock_guard lock(wake_mutex);
      stopping = true;
    }
    wake.notify_all();
    for (auto& t : workers) t.join();
  }

  static uint64_t generation_of(uint64_t word) { return word >> 16; }
  static int participants_of(uint64_t word) { return static_cast<int>(word & 0xffff); }

  void run_piece(int64_t p) {
    if (bounds[p] < bounds[p + 1]) (*body)(bounds[p], bounds[p + 1]);
  }

  // Participant `index` of `participants` takes its own share's pieces, then those left in the
  // shares after it.
  void run_pieces(int index, int participants) {
    for (int d = 0; d < participants; ++d) {
      share_cursor& c = cursors[(index + d) % participants];
      for (int64_t p = c.next.fetch_add(1, std::memory_order_relaxed); p < c.end;
           p = c.next.fetch_add(1, std::memory_order_relaxed))
        run_piece(p);
    }
  }

  void worker_loop(int index) {
    uint64_t seen = 0;
    for (;;) {
      uint64_t word = job_word.load(std::memory_order_acquire);
      for (int i = 0; generation_of(word) == seen && i < k_spin_iterations; ++i) {
        cpu_relax();
        word = job_word.load(std::memory_order_acquire);
      }
      if (generation_of(word) == seen) {
        std::unique_lock lock(wake_mutex);
        wake.wait(lock, [&] {
          word = job_word.load(std::memory_order_acquire);
          return stopping || generation_of(word) != seen;
        });
        if (stopping) return;
      }
      seen = generation_of(word);
      if (index >= participants_of(word)) continue;  // this job has fewer pieces than threads
      try {
        const running_scope running(this);
        run_pieces(index, participants_of(word));
      } catch (...) {
        std::lock_guard lock(error_mutex);
        if (!error) error = std::current_exception();
      }
      if (pending.fetch_sub(1, std::memory_order_acq_rel) == 1) {
        std::lock_guard lock(wake_mutex);
        done.notify_one();
      }
    }
  }
};

thread_pool::thread_pool(int threads) : impl_(std::make_unique<impl>()) {
  if (threads < 1 || threads > 0xffff)
    throw std::invalid_argument("thread_pool: thread count must be in 1..65535, got " + std::to_string(threads));
  impl_->threads = threads;
  impl* const self = impl_.get();
  try {
    self->workers.reserve(static_cast<size_t>(threads - 1));
    for (int i = 1; i < threads; ++i) self->workers.emplace_back([self, i] { self->worker_loop(i); });
  } catch (...) {
    // Allocation or thread creation failed part way: stop the threads already running (a
    // joinable std::thread must not be destroyed) before reporting it.
    self->shutdown();
    throw;
  }
}

thread_pool::~thread_pool() { impl_->shutdown(); }

int thread_pool::size() const { return impl_->threads; }

void thread_pool::parallel_for(int64_t n, int64_t grain, range_fn body) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  // A participant per grain at most, so that each share holds at least a grain, and
  // k_max_participants at most (the piece and cursor tables are sized for them).
  const int participants = static_cast<int>(
      std::min<int64_t>({impl_->threads, std::max<int64_t>(1, n / grain), k_max_participants}));
  if (participants <= 1 || running_on_this_thread(impl_.get())) {
    body(0, n);
    return;
  }

  std::lock_guard submit(impl_->submit_mutex);
  impl_->body = &body;
  plan_pieces(n, grain, participants, impl_->bounds, impl_->first_piece);
  for (int i = 0; i < participants; ++i) {
    impl_->cursors[i].next.store(impl_->first_piece[i], std::memory_order_relaxed);
    impl_->cursors[i].end = impl_->first_piece[i + 1];
  }
  impl_->error = nullptr;
  impl_->pending.store(participants - 1, std::memory_order_relaxed);
  {
    // Publish under the lock so a worker between its predicate check and its wait cannot miss it.
    std::lock_guard lock(impl_->wake_mutex);
    const uint64_t next = impl::generation_of(impl_->job_word.load(std::memory_order_relaxed)) + 1;
    impl_->job_word.store(next << 16 | static_cast<uint64_t>(participants), std::memory_order_release);
  }
  impl_->wake.notify_all();

  // The caller is participant 0.
  std::exception_ptr own_error;
  try {
    const running_scope running(impl_.get());
    impl_->run_pieces(0, participants);
  } catch (...) {
    own_error = std::current_exception();
  }

  for (int i = 0; i < k_spin_iterations && impl_->pending.load(std::memory_order_acquire) != 0; ++i) cpu_relax();
  if (impl_->pending.load(std::memory_order_acquire) != 0) {
    std::unique_lock lock(impl_->wake_mutex);
    impl_->done.wait(lock, [&] { return impl_->pending.load(std::memory_order_acquire) == 0; });
  }
  impl_->body = nullptr;
  if (own_error) std::rethrow_exception(own_error);
  if (impl_->error) std::rethrow_exception(impl_->error);
}

int default_thread_count() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace tandem::kernels::cpu
