#include "kernels/cpu/thread_pool.h"

#include <doctest/doctest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <limits>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

using tandem::kernels::cpu::default_thread_count;
using tandem::kernels::cpu::team;
using tandem::kernels::cpu::thread_pool;

namespace {

// Runs body; if it has not returned within `seconds`, ends the process with a message, so a
// deadlock regression fails the suite instead of hanging it.
template <class F>
void within_seconds(int seconds, F&& body) {
  std::mutex m;
  std::condition_variable cv;
  bool finished = false;
  std::thread watchdog([&] {
    std::unique_lock lock(m);
    if (!cv.wait_for(lock, std::chrono::seconds(seconds), [&] { return finished; })) {
      std::fprintf(stderr, "thread_pool test: no return within %d s (deadlock)\n", seconds);
      std::_Exit(1);
    }
  });
  auto finish = [&] {
    {
      std::lock_guard lock(m);
      finished = true;
    }
    cv.notify_one();
    watchdog.join();
  };
  try {
    body();
  } catch (...) {
    finish();
    throw;
  }
  finish();
}

// Holds each arriving chunk until `count` distinct threads have arrived (at most 30 s): while
// they wait none can finish its own share and take another's, so each runs a chunk of its own.
class rendezvous {
 public:
  explicit rendezvous(size_t count) : count_(count) {}
  // Records this thread and waits until `count` threads have arrived; false when they did not
  // within 30 s. ids(): the threads that have arrived.
  bool arrive() {
    std::unique_lock lock(m_);
    ids_.insert(std::this_thread::get_id());
    cv_.notify_all();
    return cv_.wait_for(lock, std::chrono::seconds(30), [&] { return ids_.size() >= count_; });
  }
  std::set<std::thread::id> ids() {
    std::lock_guard lock(m_);
    return ids_;
  }

 private:
  size_t count_;
  std::mutex m_;
  std::condition_variable cv_;
  std::set<std::thread::id> ids_;
};

}  // namespace

TEST_SUITE("thread_pool") {
  TEST_CASE("every index runs exactly once, in chunks of at least grain") {
    for (int threads : {1, 2, 3, 8}) {
      thread_pool pool(threads);
      CHECK(pool.size() == threads);
      for (int64_t n : {1, 2, 7, 64, 1000}) {
        for (int64_t grain : {1, 3, 16, 5000}) {
          CAPTURE(threads);
          CAPTURE(n);
          CAPTURE(grain);
          std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
          std::mutex m;
          std::vector<std::pair<int64_t, int64_t>> chunks;
          pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
            for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1);
            std::lock_guard lock(m);
            chunks.emplace_back(b, e);
          });
          for (const auto& h : hits) REQUIRE(h.load() == 1);
          REQUIRE(!chunks.empty());
          CHECK(chunks.size() <= 256);
          if (chunks.size() > 1)
            for (const auto& [b, e] : chunks) CHECK(e - b >= grain);
          // Each participant's share of the range is cut on its own, finest at its end: no
          // chunk crosses a share's boundary, and the chunk that ends a share is under twice
          // the finest piece (the grain, or an eighth of the share if that is larger).
          std::sort(chunks.begin(), chunks.end());
          const int64_t shares = std::min<int64_t>(threads, std::max<int64_t>(1, n / grain));
          if (shares > 1) {
            for (int64_t i = 0; i < shares; ++i) {
              const int64_t begin = n * i / shares, end = n * (i + 1) / shares;
              int64_t in_share = 0;
              for (const auto& [b, e] : chunks) {
                CHECK_FALSE((b < begin && e > begin));  // crosses the share's start
                if (b >= begin && e <= end) ++in_share;
                if (e == end) CHECK(e - b < 2 * std::max(grain, (end - begin) / 8));
              }
              CHECK(in_share >= 1);
              CHECK(in_share <= 64);
            }
          }
          // The same call makes the same chunks.
          std::vector<std::pair<int64_t, int64_t>> again;
          pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
            std::lock_guard lock(m);
            again.emplace_back(b, e);
          });
          std::sort(again.begin(), again.end());
          CHECK(again == chunks);
        }
      }
    }
  }

  TEST_CASE("with many threads and a long range the tail is still cut finest") {
    // 64 or 128 shares over a million items: the piece table must not overflow, and the last
    // piece must be small.
    for (int threads : {64, 200}) {
      CAPTURE(threads);
      thread_pool pool(threads);
      for (const int64_t n : {int64_t{1000000}, int64_t{4096}}) {
        CAPTURE(n);
        std::mutex m;
        std::vector<std::pair<int64_t, int64_t>> chunks;
        pool.parallel_for(n, 1, [&](int64_t b, int64_t e) {
          std::lock_guard lock(m);
          chunks.emplace_back(b, e);
        });
        std::sort(chunks.begin(), chunks.end());
        REQUIRE(chunks.front().first == 0);
        for (size_t i = 1; i < chunks.size(); ++i) REQUIRE(chunks[i].first == chunks[i - 1].second);
        REQUIRE(chunks.back().second == n);
        CHECK(chunks.size() <= 4096);
        const int64_t first = chunks.front().second - chunks.front().first;
        const int64_t last = chunks.back().second - chunks.back().first;
        CHECK(last <= first);
        CHECK(last * 100 <= n);
      }
    }
  }

  TEST_CASE("a range near the top of int64 is cut into shares without overflow") {
    // Share bounds are n * i / participants: computed as a product they would overflow here.
    thread_pool pool(4);
    const int64_t n = std::numeric_limits<int64_t>::max() / 2 + 12345;
    std::mutex m;
    std::vector<std::pair<int64_t, int64_t>> chunks;
    pool.parallel_for(n, n / 8, [&](int64_t b, int64_t e) {
      std::lock_guard lock(m);
      chunks.emplace_back(b, e);
    });
    std::sort(chunks.begin(), chunks.end());
    REQUIRE(chunks.size() >= 4);
    CHECK(chunks.front().first == 0);
    for (size_t i = 1; i < chunks.size(); ++i) CHECK(chunks[i].first == chunks[i - 1].second);
    CHECK(chunks.back().second == n);
    for (const auto& [b, e] : chunks) CHECK(e - b >= n / 8);
  }

  TEST_CASE("chunks spread over distinct threads, small jobs stay on the caller") {
    thread_pool pool(4);
    rendezvous all(4);
    within_seconds(60, [&] { pool.parallel_for(4, 1, [&](int64_t, int64_t) { CHECK(all.arrive()); }); });
    const auto ids_seen = all.ids();
    CHECK(ids_seen.size() == 4);
    CHECK(ids_seen.count(std::this_thread::get_id()) == 1);  // the caller takes a chunk

    std::mutex m;
    std::set<std::thread::id> ids;
    pool.parallel_for(100, 1000, [&](int64_t b, int64_t e) {
      CHECK(b == 0);
      CHECK(e == 100);
      ids.insert(std::this_thread::get_id());
    });
    CHECK(ids == std::set<std::thread::id>{std::this_thread::get_id()});
  }

  TEST_CASE("a free thread takes the chunks a busy one has not started") {
    // The chunk at 0 blocks until every other index has run: with a fixed share per thread
    // that could never happen; here the other thread must take the rest of its share too.
    // (Usually the caller runs it, but a worker that wakes first may take it.)
    thread_pool pool(2);
    std::mutex m;
    std::condition_variable cv;
    int others_done = 0;
    std::thread::id blocked;
    std::set<std::thread::id> other_ids;
    within_seconds(60, [&] {
      pool.parallel_for(8, 1, [&](int64_t b, int64_t e) {
        std::unique_lock lock(m);
        if (b == 0) {
          blocked = std::this_thread::get_id();
          CHECK(e < 4);  // half of its share
          CHECK(cv.wait_for(lock, std::chrono::seconds(30), [&] { return others_done == 8 - e; }));
        } else {
          others_done += static_cast<int>(e - b);
          other_ids.insert(std::this_thread::get_id());
          cv.notify_all();
        }
      });
    });
    CHECK(others_done > 0);
    REQUIRE(other_ids.size() == 1);
    CHECK(*other_ids.begin() != blocked);
  }

  TEST_CASE("each thread starts on its own share and walks shares front to back") {
    // While the first chunks wait for each other no thread can take another's share, so they
    // are the shares' first pieces (half a share each). Each thread claims in order, so its
    // chunks within any one share ascend.
    thread_pool pool(3);
    constexpr int64_t n = 3000;
    rendezvous all(3);
    std::mutex m;
    std::vector<std::pair<std::thread::id, std::pair<int64_t, int64_t>>> order;
    std::vector<std::pair<int64_t, int64_t>> firsts;
    within_seconds(60, [&] {
      pool.parallel_for(n, 1, [&](int64_t b, int64_t e) {
        bool first = false;
        {
          std::lock_guard lock(m);
          const auto me = std::this_thread::get_id();
          first = std::none_of(order.begin(), order.end(), [&](const auto& o) { return o.first == me; });
          order.push_back({std::this_thread::get_id(), {b, e}});
          if (first) firsts.emplace_back(b, e);
        }
        if (first) CHECK(all.arrive());
      });
    });
    std::sort(firsts.begin(), firsts.end());
    CHECK(firsts == std::vector<std::pair<int64_t, int64_t>>{{0, 500}, {1000, 1500}, {2000, 2500}});
    for (const auto& id : all.ids()) {
      int64_t last_begin[3] = {-1, -1, -1};
      for (const auto& [who, chunk] : order) {
        if (who != id) continue;
        const auto share = static_cast<size_t>(chunk.first * 3 / n);
        CHECK(chunk.first > last_begin[share]);
        last_begin[share] = chunk.first;
      }
    }
  }

  TEST_CASE("a pool of one runs inline") {
    thread_pool pool(1);
    int calls = 0;
    pool.parallel_for(1000, 1, [&](int64_t b, int64_t e) {
      ++calls;
      CHECK(b == 0);
      CHECK(e == 1000);
      CHECK(std::this_thread::get_id() == std::this_thread::get_id());
    });
    CHECK(calls == 1);
  }

  TEST_CASE("empty ranges call nothing") {
    thread_pool pool(2);
    int calls = 0;
    pool.parallel_for(0, 1, [&](int64_t, int64_t) { ++calls; });
    CHECK(calls == 0);
  }

  TEST_CASE("many back-to-back jobs") {
    // Exercises the hand-off between jobs: a late worker must never run a stale chunk.
    thread_pool pool(3);
    for (int iter = 0; iter < 2000; ++iter) {
      const int64_t n = 1 + iter % 7;
      std::atomic<int64_t> sum{0};
      pool.parallel_for(n, 1, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) sum.fetch_add(i + 1);
      });
      REQUIRE(sum.load() == n * (n + 1) / 2);
    }
  }

  TEST_CASE("a thread still looking for work after its job ended never runs a piece of it") {
    // Shares of several pieces, bodies of uneven length: one thread often takes the other's
    // last pieces and the job ends while the other is still claiming. A claim that landed then
    // would run a piece twice (or of the next job's share with this one's bounds), which the
    // per-index counts catch. Found as a hang in "concurrent submitters are serialized". Two
    // busy threads besides the pool's make the scheduler preempt pool threads mid-claim,
    // which is how the window opens.
    thread_pool pool(2);
    constexpr int64_t n = 64;
    std::vector<std::atomic<int>> hits(n);
    std::atomic<bool> stop{false};
    auto busy = [&] {
      while (!stop.load(std::memory_order_relaxed)) std::atomic_signal_fence(std::memory_order_seq_cst);
    };
    std::thread noise1(busy), noise2(busy);
    within_seconds(120, [&] {
      for (int iter = 0; iter < 20000; ++iter) {
        for (auto& h : hits) h.store(0, std::memory_order_relaxed);
        pool.parallel_for(n, 1, [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) hits[static_cast<size_t>(i)].fetch_add(1, std::memory_order_relaxed);
          if ((b + iter) % 5 == 0)
            for (int spin = 0; spin < 200; ++spin) std::atomic_signal_fence(std::memory_order_seq_cst);
        });
        int64_t wrong = 0;
        for (const auto& h : hits) wrong += h.load(std::memory_order_relaxed) != 1;
        if (wrong != 0) {
          stop = true;
          noise1.join();
          noise2.join();
          FAIL("job " << iter << ": " << wrong << " indices not run exactly once");
        }
      }
    });
    stop = true;
    noise1.join();
    noise2.join();
  }

  TEST_CASE("a share's first piece is run by its own thread") {
    // The first chunk of the worker's share waits until the caller has run every other chunk:
    // the caller must not take it (it would wait on itself), and can take the rest.
    thread_pool pool(2);
    constexpr int64_t n = 16;  // shares [0, 8) and [8, 16); the worker's first piece is [8, 12)
    std::mutex m;
    std::condition_variable cv;
    int64_t others = 0;
    std::thread::id first_runner;
    within_seconds(60, [&] {
      pool.parallel_for(n, 1, [&](int64_t b, int64_t e) {
        std::unique_lock lock(m);
        if (b == 8) {
          first_runner = std::this_thread::get_id();
          CHECK(cv.wait_for(lock, std::chrono::seconds(30), [&] { return others == n - (e - b); }));
        } else {
          others += e - b;
          cv.notify_all();
        }
      });
    });
    CHECK(first_runner != std::this_thread::get_id());
    CHECK(others == n - 4);
  }

  TEST_CASE("nested calls on the same pool run inline") {
    thread_pool pool(2);
    std::atomic<int> inner{0};
    pool.parallel_for(2, 1,
                      [&](int64_t, int64_t) { pool.parallel_for(10, 1, [&](int64_t b, int64_t e) { inner.fetch_add(static_cast<int>(e - b)); }); });
    CHECK(inner.load() == 20);
  }

  TEST_CASE("exceptions reach the caller and the pool stays usable") {
    thread_pool pool(2);
    CHECK_THROWS_WITH_AS(pool.parallel_for(2, 1,
                                           [&](int64_t b, int64_t) {
                                             if (b == 1) throw std::runtime_error("chunk 1 failed");
                                           }),
                         "chunk 1 failed", std::runtime_error);
    std::atomic<int> count{0};
    pool.parallel_for(2, 1, [&](int64_t b, int64_t e) { count.fetch_add(static_cast<int>(e - b)); });
    CHECK(count.load() == 2);
  }

  TEST_CASE("concurrent submitters are serialized") {
    thread_pool pool(2);
    std::atomic<int64_t> total{0};
    auto submit = [&] {
      for (int i = 0; i < 200; ++i) pool.parallel_for(16, 1, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
    };
    std::thread other(submit);
    submit();
    other.join();
    CHECK(total.load() == 2 * 200 * 16);
  }

  TEST_CASE("run_team runs every member once, each on its own thread, all at the same time") {
    for (const int threads : {2, 3}) {
      CAPTURE(threads);
      thread_pool pool(threads);
      std::vector<std::thread::id> ids(static_cast<size_t>(threads));
      std::atomic<int> calls{0};
      within_seconds(30, [&] {
        pool.run_team([&](int member, team& t) {
          CHECK(t.members() == threads);
          ids[static_cast<size_t>(member)] = std::this_thread::get_id();
          calls.fetch_add(1);
          // Nobody leaves before every member has arrived: they run at once.
          t.sync(member);
          CHECK(calls.load() == threads);
        });
      });
      CHECK(calls.load() == threads);
      CHECK(ids[0] == std::this_thread::get_id());  // member 0 is the caller
      CHECK(std::set<std::thread::id>(ids.begin(), ids.end()).size() == static_cast<size_t>(threads));
    }
  }

  TEST_CASE("team::sync: each step sees what every member wrote before it") {
    // Members write their slot, sync, read every slot, sync: a read of a slot from the step
    // before, or one overwritten by the step after, is caught. Many teams back to back, so a
    // barrier word left by an earlier team must not read as arrived in a later one.
    thread_pool pool(3);
    std::vector<int64_t> slots(3, -1);
    std::atomic<int64_t> wrong{0};
    within_seconds(60, [&] {
      for (int64_t round_base = 0; round_base < 300; ++round_base) {
        pool.run_team([&](int member, team& t) {
          for (int64_t step = 0; step < 20; ++step) {
            const int64_t value = (round_base * 20 + step) * 8;
            slots[static_cast<size_t>(member)] = value + member;
            t.sync(member);
            for (int m = 0; m < t.members(); ++m)
              if (slots[static_cast<size_t>(m)] != value + m) wrong.fetch_add(1);
            t.sync(member);
          }
        });
      }
    });
    CHECK(wrong.load() == 0);
  }

  TEST_CASE("run_team wakes workers that fell asleep between teams") {
    // Idle gaps around the time a worker spins before it sleeps: some workers are asleep at
    // the publish, some just falling asleep. The caller's member waits in sync for them, so a
    // worker left asleep would never come. (The narrowest case, a worker falling asleep in
    // the nanoseconds of the publish, is too rare to hit here: it hung a CLI test once before
    // run_team checked for sleepers ahead of the caller's member.)
    thread_pool pool(2);
    std::atomic<int> ran{0};
    within_seconds(120, [&] {
      for (int i = 0; i < 1500; ++i) {
        const auto gap = std::chrono::microseconds(i % 7 == 0 ? 300 : (i * 13) % 90);
        const auto until = std::chrono::steady_clock::now() + gap;
        while (std::chrono::steady_clock::now() < until) {
        }
        pool.run_team([&](int member, team& t) {
          t.sync(member);
          ran.fetch_add(1);
        });
      }
    });
    CHECK(ran.load() == 2 * 1500);
  }

  TEST_CASE("a member's exception reaches the caller, the others leave their sync, and the pool stays usable") {
    thread_pool pool(3);
    for (const int thrower : {0, 1, 2}) {
      CAPTURE(thrower);
      std::atomic<int> left{0};
      const std::string message = "member " + std::to_string(thrower);
      within_seconds(30, [&] {
        CHECK_THROWS_WITH_AS(pool.run_team([&](int member, team& t) {
          if (member == thrower) throw std::runtime_error("member " + std::to_string(member));
          left.fetch_add(1);
          t.sync(member);  // never completes: the thrower does not arrive
          t.sync(member);
          left.fetch_add(100);
        }),
                             doctest::Contains(message.c_str()), std::runtime_error);
      });
      CHECK(left.load() == 2);
      std::atomic<int> after{0};
      within_seconds(30, [&] {
        pool.run_team([&](int member, team& t) {
          t.sync(member);
          after.fetch_add(1);
        });
        pool.parallel_for(30, 1, [&](int64_t b, int64_t e) { after.fetch_add(static_cast<int>(e - b)); });
      });
      CHECK(after.load() == 3 + 30);
    }
  }

  TEST_CASE("run_team on a pool of one, or inside a chunk of its own pool, is a team of one on the calling thread") {
    thread_pool one(1), two(2);
    int calls = 0;
    one.run_team([&](int member, team& t) {
      CHECK(member == 0);
      CHECK(t.members() == 1);
      t.sync(member);
      ++calls;
    });
    CHECK(calls == 1);
    std::atomic<int> inner{0};
    within_seconds(30, [&] {
      two.parallel_for(2, 1, [&](int64_t, int64_t) {
        const auto caller = std::this_thread::get_id();
        two.run_team([&](int member, team& t) {
          CHECK(member == 0);
          CHECK(t.members() == 1);
          CHECK(std::this_thread::get_id() == caller);
          t.sync(member);
          inner.fetch_add(1);
        });
      });
    });
    CHECK(inner.load() == 2);
  }

  TEST_CASE("concurrent run_team and parallel_for callers are serialized") {
    thread_pool pool(2);
    std::atomic<int64_t> total{0};
    within_seconds(60, [&] {
      std::thread other([&] {
        for (int i = 0; i < 200; ++i) pool.parallel_for(16, 1, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
      });
      for (int i = 0; i < 200; ++i)
        pool.run_team([&](int member, team& t) {
          t.sync(member);
          total.fetch_add(1);
        });
      other.join();
    });
    CHECK(total.load() == 200 * 16 + 200 * 2);
  }

  TEST_CASE("thread counts") {
    CHECK(default_thread_count() >= 1);
    CHECK_THROWS_AS(thread_pool(0), std::invalid_argument);
  }

  TEST_CASE("a chunk may use another pool and then nest in its own pool again") {
    thread_pool a(2), b(2);
    within_seconds(20, [&] {
      SUBCASE("B inside A, then A again") {
        std::atomic<int> in_b{0}, in_a{0};
        a.parallel_for(2, 1, [&](int64_t, int64_t) {
          b.parallel_for(4, 1, [&](int64_t lo, int64_t hi) { in_b.fetch_add(static_cast<int>(hi - lo)); });
          // A's job is still running on this thread: this must run inline, not wait for A.
          a.parallel_for(10, 1, [&](int64_t lo, int64_t hi) { in_a.fetch_add(static_cast<int>(hi - lo)); });
        });
        CHECK(in_b.load() == 2 * 4);
        CHECK(in_a.load() == 2 * 10);
      }
      SUBCASE("A inside B inside A on the same thread") {
        std::atomic<int> in_a{0};
        a.parallel_for(2, 1, [&](int64_t, int64_t) {
          b.parallel_for(2, 1, [&](int64_t lo, int64_t) {
            // Chunk 0 of B runs on the thread that called B, which is inside a chunk of A.
            if (lo == 0) a.parallel_for(6, 1, [&](int64_t x, int64_t y) { in_a.fetch_add(static_cast<int>(y - x)); });
          });
        });
        CHECK(in_a.load() == 2 * 6);
      }
      SUBCASE("an exception in the inner pool leaves the outer pool nestable") {
        std::atomic<int> caught{0}, in_a{0};
        a.parallel_for(2, 1, [&](int64_t, int64_t) {
          try {
            b.parallel_for(2, 1, [&](int64_t, int64_t) { throw std::runtime_error("inner"); });
          } catch (const std::runtime_error&) {
            caught.fetch_add(1);
          }
          a.parallel_for(4, 1, [&](int64_t lo, int64_t hi) { in_a.fetch_add(static_cast<int>(hi - lo)); });
        });
        CHECK(caught.load() == 2);
        CHECK(in_a.load() == 2 * 4);
      }
    });
    // And the pools still split work over their threads afterwards.
    rendezvous both(2);
    within_seconds(60, [&] { a.parallel_for(2, 1, [&](int64_t, int64_t) { CHECK(both.arrive()); }); });
    CHECK(both.ids().size() == 2);
  }

  TEST_CASE("the body is taken by reference, whatever callable it is") {
    thread_pool pool(1);
    struct counter {
      int calls = 0;
      void operator()(int64_t, int64_t) { ++calls; }
    } c;
    pool.parallel_for(10, 1, c);
    pool.parallel_for(10, 1, c);
    CHECK(c.calls == 2);  // the pool called this object, not a copy

    int64_t covered = 0;
    const std::function<void(int64_t, int64_t)> f = [&](int64_t b, int64_t e) { covered += e - b; };
    pool.parallel_for(7, 1, f);
    const auto g = [&](int64_t b, int64_t e) { covered += e - b; };
    pool.parallel_for(5, 1, g);
    CHECK(covered == 12);
  }

  TEST_CASE("bad thread counts are rejected") {
    for (int n : {-1, 0, 65536}) {
      CAPTURE(n);
      CHECK_THROWS_AS(thread_pool{n}, std::invalid_argument);
    }
    CHECK_NOTHROW(thread_pool{1});
  }
}
