// Fixed pool of worker threads for splitting one kernel call across cores.
#pragma once

#include <cstdint>
#include <memory>
#include <type_traits>

namespace tandem::kernels::cpu {

// A non-owning reference to a callable body(begin, end): two pointers, built without
// allocating whatever the callable captures (std::function would allocate for captures over
// 16 bytes, on every kernel call). The callable must outlive the call it is passed to, which
// a lambda written in the argument list does.
class range_fn {
 public:
  template <class F>
  requires(!std::is_same_v<std::remove_cvref_t<F>, range_fn> && std::is_invocable_v<F&, int64_t, int64_t>) range_fn(F&& f)
  noexcept  // NOLINT: implicit, so call sites pass lambdas directly
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* object, int64_t begin, int64_t end) { (*static_cast<std::remove_reference_t<F>*>(object))(begin, end); }) {}
  void operator()(int64_t begin, int64_t end) const { call_(object_, begin, end); }

 private:
  void* object_;
  void (*call_)(void*, int64_t, int64_t);
};

// What the members of one thread_pool::run_team call share: their count and a barrier.
class team {
 public:
  int members() const { return members_; }
  // Returns once every member has made its k-th call, for the k-th call of this member: the
  // steps between two syncs see everything written before the first. Every member must make
  // the same number of calls. If another member's body ended by an exception, throws
  // team_aborted instead (run_team swallows it and rethrows the original). Does not allocate.
  void sync(int member);

 private:
  friend class thread_pool;
  struct state;  // the pool's barrier lines (thread_pool.cpp)
  team(int members, uint64_t id, state* s) : members_(members), id_(id), state_(s) {}
  int members_;
  uint64_t id_;   // unique per run_team call on its pool: tags the barrier words
  state* state_;  // null for a team of one
};

// Thrown by team::sync in the members that outlive one whose body threw.
struct team_aborted {};

// A non-owning reference to body(member, team&), as range_fn.
class team_fn {
 public:
  template <class F>
  requires(!std::is_same_v<std::remove_cvref_t<F>, team_fn> && std::is_invocable_v<F&, int, team&>) team_fn(F&& f)
  noexcept  // NOLINT: implicit, so call sites pass lambdas directly
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(f)))),
        call_([](void* object, int member, team& t) { (*static_cast<std::remove_reference_t<F>*>(object))(member, t); }) {}
  void operator()(int member, team& t) const { call_(object_, member, t); }

 private:
  void* object_;
  void (*call_)(void*, int, team&);
};

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
  // caller, when n < 2 * grain), body(begin, end). Each participating thread (at most 128
  // take part, at most one per grain) has an even share of the range, cut into chunks that
  // halve toward the share's end, down to the grain or an eighth of the share, whichever is
  // larger. A thread runs its own share's chunks front to back, then takes chunks of other
  // shares that nobody has started, except their first, which the share's own thread always
  // runs (so a job waits for every participating worker to wake). A given (n, grain, size())
  // always makes the same chunks; which thread runs the others is decided as they go, so a
  // body must not depend on it. The first exception a chunk throws is rethrown here after
  // all chunks end. Does not allocate.
  // Nesting: a call made from inside a chunk of this pool, directly or through chunks of
  // other pools on the same thread, runs inline on that thread. A chunk may use another pool
  // B; B's chunks must not then call back into this pool (B's workers would wait for this
  // pool, which waits for them).
  void parallel_for(int64_t n, int64_t grain, range_fn body);

  // Runs body(member, t) once on every thread of the pool at the same time (member 0 on the
  // caller), for steps split into fixed parts with barriers (t.sync) instead of a
  // parallel_for each: a decode layer pays one job hand-off instead of five, which matters
  // where the cores sit on different dies; fixed parts give up parallel_for's balancing. Called from inside a chunk or member of this pool, or on a
  // pool of one, runs as a team of one on the calling thread. The first exception a member throws is rethrown here after every member has returned;
  // members waiting in sync then leave by team_aborted. Calls from several threads at once are serialized. Does not allocate.
  void run_team(team_fn body);

 private:
  // Publishes and runs a job of `participants` shares (under submit_mutex).
  void run_locked(int64_t n, int64_t grain, int participants, const range_fn& body);

  struct impl;
  std::unique_ptr<impl> impl_;
};

// Share i of n items over `count` participants is [share_start(n, count, i),
// share_start(n, count, i + 1)): parallel_for's shares, and the team parts' (ops.h). Computed
// without the product n * i, which could overflow.
inline int64_t share_start(int64_t n, int64_t count, int64_t i) { return n / count * i + n % count * i / count; }

// Threads to use by default: the number of cores this process may run on.
int default_thread_count();

}  // namespace tandem::kernels::cpu
