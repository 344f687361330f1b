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
// per product. Then it takes the pieces of other shares that nobody has started: on a shared
// machine one core often runs slower for a while (another tenant, an interrupt), and with a
// fixed share per thread the other core would wait for it at every call. The pieces halve
// toward the end of each share down to an eighth of it, so what is left to take, and the wait
// of a thread that finishes first, are small.
// Shares rather than one queue of shrinking pieces over the whole range, which interleaved
// the cores' pieces and moved one counter between them at every claim (decode read ~12% less);
// pieces stop at an eighth of a share because each small piece pays a claim.
constexpr int64_t k_max_participants = 128;
constexpr int64_t k_finest_of_share = 8;
// Halving down to an eighth makes 4 or 5 pieces a share (1/2, 1/4, 1/8, the rest); the cap
// only bounds share_plan.
constexpr int k_max_share_pieces = 8;

// Everything here is laid out for two cores that may sit on different dies of a server CPU
// (a cloud VM's two vCPUs often do: that doubles their memory bandwidth, and a cache line then
// takes ~0.2 us to move between them, against ~0.04 us on one die). A decode step runs ~80
// jobs, so each line a job moves between the cores on its critical path costs ~1% of a token:
// - the job (generation, participants, range, grain, body) is one line, read with one miss;
// - each thread computes the pieces itself from (n, grain, participants): no table to read;
// - the first piece of each share is its owner's, so a worker can never come late to a job
//   whose fields were already overwritten; the rest are claimed from a cursor on the owner's
//   own line, tagged with the job's generation, so no one resets it between jobs;
// - a worker reports the pieces it finished on its own line, and the submitter returns once
//   the counts add up, without waiting for the worker to look for more work;
// - no mutex or condition variable is touched unless a thread actually sleeps.
// Why: docs/cpu-kernels.md, "Thread pool and layer teams".

// The pieces of one share: [bounds[p], bounds[p + 1]) for p < count. Each is half of what is
// left of the share, never under `finest` (the grain, or an eighth of the share if larger); a
// remainder under `finest` joins the piece before it. Depends on n, grain, participants and
// the share only, so every thread computes the same pieces.
struct share_plan {
  int64_t bounds[k_max_share_pieces + 1];
  int count = 0;
};

void plan_share(int64_t n, int64_t grain, int64_t participants, int64_t share, share_plan& plan) {
  const int64_t begin = share_start(n, participants, share), end = share_start(n, participants, share + 1);
  const int64_t finest = std::max(grain, (end - begin) / k_finest_of_share);
  int k = 0;
  for (int64_t cur = begin; cur < end;) {
    plan.bounds[k++] = cur;
    const int64_t rest = end - cur;
    int64_t size = std::max(finest, rest / 2);
    if (rest - size < finest || k == k_max_share_pieces) size = rest;
    cur += size;
  }
  plan.bounds[k] = end;
  plan.count = k;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// Tags: the low 32 bits of a job's generation, packed with a count into one word.
inline uint64_t tagged(uint32_t tag, uint64_t count) { return uint64_t{tag} << 32 | count; }
inline uint32_t tag_of(uint64_t word) { return static_cast<uint32_t>(word >> 32); }
inline int64_t count_of(uint64_t word) { return static_cast<int64_t>(word & 0xffffffffu); }

// Pause iterations a member waits in team::sync before it starts yielding its core: a member
// waits there for the other's share of a product (microseconds), but on a shared machine the
// other may have lost its core for a while, and spinning on would keep it off.
constexpr int k_team_spin_iterations = 20000;

// A barrier word: the team's id above the count of syncs its member has made.
constexpr int k_sync_bits = 24;

}  // namespace

// One line per member, each written by its member only: a member arriving at a barrier moves
// only its own line, and the others read it, one transfer between two dies rather than the
// two of a shared counter (fetch-and-add, then the waiter's read).
struct team::state {
  struct alignas(64) line {
    std::atomic<uint64_t> word{0};
  };
  std::unique_ptr<line[]> lines;
  alignas(64) std::atomic<uint64_t> aborted{0};  // id of the last team a member's exception ended
};

void team::sync(int member) {
  if (!state_) return;
  std::atomic<uint64_t>& mine = state_->lines[static_cast<size_t>(member)].word;
  const uint64_t w = mine.load(std::memory_order_relaxed);
  const uint64_t next = (w >> k_sync_bits) == id_ ? w + 1 : (id_ << k_sync_bits | 1);
  mine.store(next, std::memory_order_release);
  for (int m = 0; m < members_; ++m) {
    if (m == member) continue;
    const std::atomic<uint64_t>& other = state_->lines[static_cast<size_t>(m)].word;
    // Words of earlier teams are smaller (ids only grow), so they read as "not arrived".
    for (int spins = 0; other.load(std::memory_order_acquire) < next;) {
      if (state_->aborted.load(std::memory_order_relaxed) == id_) throw team_aborted{};
      if (++spins < k_team_spin_iterations)
        cpu_relax();
      else
        std::this_thread::yield();
    }
  }
}

struct thread_pool::impl {
  int threads = 1;
  std::vector<std::thread> workers;

  std::mutex submit_mutex;  // one parallel_for or run_team at a time per pool
  team::state team_state;   // barrier lines of run_team
  uint64_t team_ids = 0;    // the last run_team's id (under submit_mutex)

  // The current job. n, grain and body are written before word is published (release) and
  // stay until the job ends; the job cannot end before every participant has run the first
  // piece of its share, so each participant reads them while they are this job's.
  struct alignas(64) job_line {
    std::atomic<uint64_t> word{0};  // generation << 16 | participants
    std::atomic<int64_t> n{0};
    std::atomic<int64_t> grain{0};
    std::atomic<const range_fn*> body{nullptr};
  };
  job_line job;

  // Share i's next unclaimed piece, tagged with the job it belongs to. A word tagged with an
  // earlier job means no piece after the first has been claimed yet in this one.
  struct alignas(64) cursor_line {
    std::atomic<uint64_t> word{0};
  };
  cursor_line cursors[k_max_participants];

  // Pieces participant i (a worker) has finished in the job its tag names.
  struct alignas(64) progress_line {
    std::atomic<uint64_t> word{0};
  };
  progress_line progress[k_max_participants];

  alignas(64) std::atomic<int> sleepers{0};                // workers asleep on `wake`, or about to be
  alignas(64) std::atomic<bool> submitter_waiting{false};  // the submitter is asleep on `done`

  std::exception_ptr error;  // first exception thrown by a worker chunk
  std::mutex error_mutex;

  std::mutex wake_mutex;
  std::condition_variable wake;  // workers sleep here between jobs
  std::condition_variable done;  // the submitter sleeps here until the pieces are finished
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

  // Claims the next piece of share j in the job tagged `tag`, whose share has `count` pieces;
  // -1 when none is left. A thread may still be looking here after its job has ended (others
  // finished the pieces while it looked), so a tag later than its own means "nothing left";
  // once a job ends, every share with more than one piece is tagged with it.
  int64_t claim(int j, uint32_t tag, int count) {
    std::atomic<uint64_t>& c = cursors[j].word;
    uint64_t cur = c.load(std::memory_order_acquire);
    for (;;) {
      int64_t next;
      if (tag_of(cur) == tag)
        next = count_of(cur);
      else if (static_cast<int32_t>(tag_of(cur) - tag) < 0)
        next = 1;  // nothing claimed yet in this job; the first piece is the owner's
      else
        return -1;
      if (next >= count) return -1;
      if (c.compare_exchange_weak(cur, tagged(tag, static_cast<uint64_t>(next + 1)), std::memory_order_acq_rel, std::memory_order_acquire))
        return next;
    }
  }

  // Before its first piece the owner knows its job is current (the job cannot end without
  // that piece), so a tag that looks later than the job's is one left 2^31 jobs ago; it is
  // marked as this job's before anyone could mistake it for the end of the job.
  void refresh_cursor(int j, uint32_t tag) {
    std::atomic<uint64_t>& c = cursors[j].word;
    uint64_t cur = c.load(std::memory_order_relaxed);
    if (tag_of(cur) != tag && static_cast<int32_t>(tag_of(cur) - tag) > 0)
      c.compare_exchange_strong(cur, tagged(tag, 1), std::memory_order_acq_rel, std::memory_order_relaxed);
  }

  // Runs one piece; an exception is kept (the first one) and the piece still counts as done.
  void run_piece(const range_fn& body, int64_t b, int64_t e, std::exception_ptr& own_error) {
    if (b >= e) return;
    try {
      body(b, e);
    } catch (...) {
      if (!own_error) own_error = std::current_exception();
    }
  }

  // Participant `index` runs the first piece of its share, the rest of its share, then the
  // pieces of the shares after it that nobody has claimed. report(k) is called with the count
  // of pieces finished so far after each one; after_first() once, after the first piece.
  template <class Report, class AfterFirst>
  void run_pieces(int index, int participants, uint32_t tag, int64_t n, int64_t grain, const range_fn& body, std::exception_ptr& own_error,
                  Report&& report, AfterFirst&& after_first) {
    share_plan plan;
    plan_share(n, grain, participants, index, plan);
    int64_t finished = 0;
    if (plan.count > 1) refresh_cursor(index, tag);
    run_piece(body, plan.bounds[0], plan.bounds[1], own_error);
    report(++finished);
    after_first();
    for (int d = 0; d < participants; ++d) {
      const int j = (index + d) % participants;
      if (d > 0) plan_share(n, grain, participants, j, plan);
      if (plan.count < 2) continue;
      for (int64_t p = claim(j, tag, plan.count); p >= 0; p = claim(j, tag, plan.count)) {
        run_piece(body, plan.bounds[p], plan.bounds[p + 1], own_error);
        report(++finished);
      }
    }
  }

  void worker_loop(int index) {
    uint64_t seen = 0;
    for (;;) {
      uint64_t word = job.word.load(std::memory_order_acquire);
      for (int i = 0; generation_of(word) == seen && i < k_spin_iterations; ++i) {
        cpu_relax();
        word = job.word.load(std::memory_order_acquire);
      }
      if (generation_of(word) == seen) {
        std::unique_lock lock(wake_mutex);
        // seq_cst against the submitter's publish-then-check: either it sees this sleeper or
        // this thread sees its job.
        sleepers.fetch_add(1, std::memory_order_seq_cst);
        wake.wait(lock, [&] {
          word = job.word.load(std::memory_order_seq_cst);
          return stopping || generation_of(word) != seen;
        });
        sleepers.fetch_sub(1, std::memory_order_relaxed);
        if (stopping) return;
      }
      seen = generation_of(word);
      const int participants = participants_of(word);
      if (index >= participants) continue;  // this job has fewer pieces than threads
      const auto tag = static_cast<uint32_t>(seen);
      const int64_t n = job.n.load(std::memory_order_relaxed), grain = job.grain.load(std::memory_order_relaxed);
      const range_fn& body = *job.body.load(std::memory_order_relaxed);
      std::exception_ptr own_error;
      bool error_kept = false;
      std::atomic<uint64_t>& mine = progress[index].word;
      {
        const running_scope running(this);
        run_pieces(
            index, participants, tag, n, grain, body, own_error,
            [&](int64_t finished) {
              // The error first: once the counts add up the submitter reads it.
              if (own_error && !error_kept) {
                keep_error(own_error);
                error_kept = true;
              }
              mine.store(tagged(tag, static_cast<uint64_t>(finished)), std::memory_order_release);
              if (submitter_waiting.load(std::memory_order_relaxed)) wake_submitter();
            },
            [] {});
      }
      // The submitter may have gone to sleep just before this thread's last report: the fence
      // orders that report before the check, as the submitter orders its flag before its own.
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (submitter_waiting.load(std::memory_order_relaxed)) wake_submitter();
    }
  }

  void keep_error(const std::exception_ptr& e) {
    std::lock_guard lock(error_mutex);
    if (!error) error = e;
  }

  void wake_submitter() {
    { std::lock_guard lock(wake_mutex); }
    done.notify_one();
  }

  void wake_workers() {
    { std::lock_guard lock(wake_mutex); }
    wake.notify_all();
  }
};

thread_pool::thread_pool(int threads) : impl_(std::make_unique<impl>()) {
  if (threads < 1 || threads > 0xffff) throw std::invalid_argument("thread_pool: thread count must be in 1..65535, got " + std::to_string(threads));
  impl_->threads = threads;
  impl_->team_state.lines = std::make_unique<team::state::line[]>(static_cast<size_t>(threads));
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
  // k_max_participants at most (the cursor and progress lines are sized for them).
  const int participants = static_cast<int>(std::min<int64_t>({impl_->threads, std::max<int64_t>(1, n / grain), k_max_participants}));
  if (participants <= 1 || running_on_this_thread(impl_.get())) {
    body(0, n);
    return;
  }

  std::lock_guard submit(impl_->submit_mutex);
  run_locked(n, grain, participants, body);
}

void thread_pool::run_team(team_fn body) {
  if (impl_->threads <= 1 || running_on_this_thread(impl_.get())) {
    team alone(1, 0, nullptr);
    body(0, alone);
    return;
  }
  std::lock_guard submit(impl_->submit_mutex);
  team::state& st = impl_->team_state;
  const uint64_t id = ++impl_->team_ids;
  const int members = static_cast<int>(std::min<int64_t>(impl_->threads, k_max_participants));
  team t(members, id, &st);
  // One item per thread and a grain of one: every share is a single piece, which its own
  // thread runs (parallel_for's contract), so member b runs on thread b, all at once.
  auto member = [&](int64_t b, int64_t) {
    // run_locked catches a worker that was just falling asleep at the publish only after the
    // caller's first piece; here that piece waits in sync for the others, so it would wait
    // for a sleeper forever. The caller checks before its piece instead.
    if (b == 0) {
      std::atomic_thread_fence(std::memory_order_seq_cst);
      if (impl_->sleepers.load(std::memory_order_relaxed) > 0) impl_->wake_workers();
    }
    try {
      body(static_cast<int>(b), t);
    } catch (const team_aborted&) {
      // Another member's exception ended the team; that one is rethrown.
    } catch (...) {
      st.aborted.store(id, std::memory_order_relaxed);
      throw;
    }
  };
  run_locked(members, 1, members, member);
}

void thread_pool::run_locked(int64_t n, int64_t grain, int participants, const range_fn& body) {
  impl& p = *impl_;
  const uint64_t generation = impl::generation_of(p.job.word.load(std::memory_order_relaxed)) + 1;
  const auto tag = static_cast<uint32_t>(generation);
  p.error = nullptr;
  p.job.n.store(n, std::memory_order_relaxed);
  p.job.grain.store(grain, std::memory_order_relaxed);
  p.job.body.store(&body, std::memory_order_relaxed);
  p.job.word.store(generation << 16 | static_cast<uint64_t>(participants), std::memory_order_release);
  // Workers that have been asleep a while: wake them now. One that is just falling asleep is
  // caught after the first piece, where the fence costs nothing (the publish has long left
  // this core), instead of here on every job's critical path.
  if (p.sleepers.load(std::memory_order_relaxed) > 0) p.wake_workers();

  int64_t total = 0;  // pieces in the job
  {
    share_plan plan;
    for (int i = 0; i < participants; ++i) {
      plan_share(n, grain, participants, i, plan);
      total += plan.count;
    }
  }

  // The caller is participant 0.
  std::exception_ptr own_error;
  int64_t own_finished = 0;
  {
    const running_scope running(impl_.get());
    p.run_pieces(
        0, participants, tag, n, grain, body, own_error, [&](int64_t finished) { own_finished = finished; },
        [&] {
          std::atomic_thread_fence(std::memory_order_seq_cst);
          if (p.sleepers.load(std::memory_order_relaxed) > 0) p.wake_workers();
        });
  }

  auto finished = [&] {
    int64_t sum = own_finished;
    for (int i = 1; i < participants; ++i) {
      const uint64_t w = p.progress[i].word.load(std::memory_order_acquire);
      if (tag_of(w) == tag) sum += count_of(w);
    }
    return sum == total;
  };
  for (int i = 0; i < k_spin_iterations && !finished(); ++i) cpu_relax();
  if (!finished()) {
    std::unique_lock lock(p.wake_mutex);
    p.submitter_waiting.store(true, std::memory_order_relaxed);
    // Pairs with the worker's fence after its last report: either it sees this flag or this
    // thread sees its report.
    std::atomic_thread_fence(std::memory_order_seq_cst);
    p.done.wait(lock, finished);
    p.submitter_waiting.store(false, std::memory_order_relaxed);
  }
  if (own_error) std::rethrow_exception(own_error);
  if (p.error) std::rethrow_exception(p.error);
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
