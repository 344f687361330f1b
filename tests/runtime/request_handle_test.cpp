// The caller's side of a request: pieces in order, token-only reading, timeouts, cancel, and
// how and when it finished.
#include "runtime/request_handle.h"

#include <doctest/doctest.h>

#include <atomic>

#include <thread>

using namespace tandem::runtime;
using namespace std::chrono_literals;

TEST_SUITE("request_handle") {
  TEST_CASE("pieces arrive in order; token reads skip text-only pieces; the end is reported once read") {
    request_handle h;
    piece p;
    CHECK_FALSE(h.next(&p, 1ms));  // nothing yet: a timeout, not the end
    CHECK(h.finished() == finish_reason::none);
    h.push(5, "a");
    h.push(6);
    h.push(-1, "tail");
    h.push(7, "b");
    CHECK(h.next(&p, 1ms));
    CHECK(p.token == 5);
    CHECK(p.text == "a");
    int32_t t = 0;
    CHECK(h.next(&t, 1ms));
    CHECK(t == 6);
    CHECK(h.next(&t, 1ms));  // "tail" (token -1) is skipped
    CHECK(t == 7);
    const auto before = std::chrono::steady_clock::now();
    h.finish(finish_reason::length);
    h.finish(finish_reason::error, "ignored: the first end stands");
    CHECK(h.finished() == finish_reason::length);
    CHECK(h.error().empty());
    CHECK(h.finished_at() >= before);
    CHECK_FALSE(h.next(&t, 1ms));
    h.wait();
  }

  TEST_CASE("cancel is a request the engine sees; a reader waiting on another thread wakes at the end") {
    request_handle h;
    CHECK_FALSE(h.cancel_requested());
    h.cancel();
    h.cancel();
    CHECK(h.cancel_requested());
    std::thread engine([&] {
      std::this_thread::sleep_for(5ms);
      h.push(1, "x");
      h.finish(finish_reason::cancelled);
    });
    piece p;
    std::string text;
    while (h.next(&p, 10s)) text += p.text;
    engine.join();
    CHECK(text == "x");
    CHECK(h.finished() == finish_reason::cancelled);
    CHECK(std::string(finish_name(finish_reason::stop)) == "stop");
    CHECK(std::string(finish_name(finish_reason::eog)) == "stop");
  }

  TEST_CASE("set_notify: called for every piece and the end, at once when something is already readable, dropped at the end") {
    request_handle h;
    std::atomic<int> calls{0};
    h.push(1, "a");
    h.set_notify([&] { ++calls; });
    CHECK(calls == 1);  // a piece was waiting
    h.push(2, "b");
    CHECK(calls == 2);
    h.finish(finish_reason::length);
    CHECK(calls == 3);
    h.push(3, "c");  // nothing follows the end: the callback is gone
    CHECK(calls == 3);
    h.set_notify(nullptr);
  }
}
