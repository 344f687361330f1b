// The /metrics registry: exact exposition text for each metric type, escaping, number
// formatting, the errors that catch misuse, and exact totals under concurrent updates.
#include "api/prometheus.h"

#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

using namespace tandem::api;

TEST_SUITE("prometheus") {
  TEST_CASE("a counter with two label sets renders in first-seen order") {
    metrics_registry r;
    r.declare("tandem_requests_total", "Requests finished.", metric_type::counter);
    r.add("tandem_requests_total", {{"model", "chat"}, {"outcome", "stop"}});
    r.add("tandem_requests_total", {{"model", "code"}, {"outcome", "length"}}, 2);
    r.add("tandem_requests_total", {{"model", "chat"}, {"outcome", "stop"}}, 3);
    CHECK(r.render() ==
          "# HELP tandem_requests_total Requests finished.\n"
          "# TYPE tandem_requests_total counter\n"
          "tandem_requests_total{model=\"chat\",outcome=\"stop\"} 4\n"
          "tandem_requests_total{model=\"code\",outcome=\"length\"} 2\n");
  }

  TEST_CASE("a gauge keeps the last value; no labels means no braces") {
    metrics_registry r;
    r.declare("tandem_kv_bytes_used", "KV cache bytes in use.", metric_type::gauge);
    r.set("tandem_kv_bytes_used", {}, 10);
    r.set("tandem_kv_bytes_used", {}, -2.5);
    r.declare("tandem_queue_depth", "Requests waiting.", metric_type::gauge);
    r.set("tandem_queue_depth", {{"model", "chat"}}, 7);
    r.set("tandem_queue_depth", {{"model", "code"}}, 0);
    CHECK(r.render() ==
          "# HELP tandem_kv_bytes_used KV cache bytes in use.\n"
          "# TYPE tandem_kv_bytes_used gauge\n"
          "tandem_kv_bytes_used -2.5\n"
          "# HELP tandem_queue_depth Requests waiting.\n"
          "# TYPE tandem_queue_depth gauge\n"
          "tandem_queue_depth{model=\"chat\"} 7\n"
          "tandem_queue_depth{model=\"code\"} 0\n");
  }

  TEST_CASE("a histogram renders cumulative buckets, +Inf, sum and count per label set") {
    metrics_registry r;
    r.declare("tandem_ttft_seconds", "Time to first token.", metric_type::histogram, {0.1, 0.5, 2});
    r.observe("tandem_ttft_seconds", {{"model", "chat"}}, 0.05);
    r.observe("tandem_ttft_seconds", {{"model", "chat"}}, 0.5);  // bounds are inclusive
    r.observe("tandem_ttft_seconds", {{"model", "chat"}}, 3);
    r.observe("tandem_ttft_seconds", {{"model", "code"}}, 1);
    CHECK(r.render() ==
          "# HELP tandem_ttft_seconds Time to first token.\n"
          "# TYPE tandem_ttft_seconds histogram\n"
          "tandem_ttft_seconds_bucket{model=\"chat\",le=\"0.1\"} 1\n"
          "tandem_ttft_seconds_bucket{model=\"chat\",le=\"0.5\"} 2\n"
          "tandem_ttft_seconds_bucket{model=\"chat\",le=\"2\"} 2\n"
          "tandem_ttft_seconds_bucket{model=\"chat\",le=\"+Inf\"} 3\n"
          "tandem_ttft_seconds_sum{model=\"chat\"} 3.55\n"
          "tandem_ttft_seconds_count{model=\"chat\"} 3\n"
          "tandem_ttft_seconds_bucket{model=\"code\",le=\"0.1\"} 0\n"
          "tandem_ttft_seconds_bucket{model=\"code\",le=\"0.5\"} 0\n"
          "tandem_ttft_seconds_bucket{model=\"code\",le=\"2\"} 1\n"
          "tandem_ttft_seconds_bucket{model=\"code\",le=\"+Inf\"} 1\n"
          "tandem_ttft_seconds_sum{model=\"code\"} 1\n"
          "tandem_ttft_seconds_count{model=\"code\"} 1\n");
  }

  TEST_CASE("a histogram without labels puts le alone in the braces") {
    metrics_registry r;
    r.declare("step_seconds", "Step time.", metric_type::histogram, {1});
    r.observe("step_seconds", {}, 0.25);
    CHECK(r.render() ==
          "# HELP step_seconds Step time.\n"
          "# TYPE step_seconds histogram\n"
          "step_seconds_bucket{le=\"1\"} 1\n"
          "step_seconds_bucket{le=\"+Inf\"} 1\n"
          "step_seconds_sum 0.25\n"
          "step_seconds_count 1\n");
  }

  TEST_CASE("a NaN observation counts in +Inf only and makes the sum NaN") {
    metrics_registry r;
    r.declare("h", "", metric_type::histogram, {1});
    r.observe("h", {}, std::nan(""));
    r.observe("h", {}, 0.5);
    CHECK(r.render() ==
          "# HELP h \n# TYPE h histogram\n"
          "h_bucket{le=\"1\"} 1\n"
          "h_bucket{le=\"+Inf\"} 2\n"
          "h_sum NaN\n"
          "h_count 2\n");
  }

  TEST_CASE("declared but never updated: HELP and TYPE only; nothing declared: empty") {
    metrics_registry r;
    CHECK(r.render().empty());
    r.declare("idle_total", "Never touched.", metric_type::counter);
    r.declare("idle_seconds", "Never observed.", metric_type::histogram, latency_buckets());
    CHECK(r.render() ==
          "# HELP idle_total Never touched.\n"
          "# TYPE idle_total counter\n"
          "# HELP idle_seconds Never observed.\n"
          "# TYPE idle_seconds histogram\n");
  }

  TEST_CASE("help escapes backslash and newline; label values also escape the quote") {
    metrics_registry r;
    r.declare("esc_total", "a\\b \"quoted\"\nsecond line", metric_type::counter);
    r.add("esc_total", {{"path", "C:\\x \"y\"\nz"}});
    CHECK(r.render() ==
          "# HELP esc_total a\\\\b \"quoted\"\\nsecond line\n"
          "# TYPE esc_total counter\n"
          "esc_total{path=\"C:\\\\x \\\"y\\\"\\nz\"} 1\n");
  }

  TEST_CASE("integral values print without a decimal point, others in shortest form") {
    CHECK(format_metric_value(0) == "0");
    CHECK(format_metric_value(-0.0) == "0");
    CHECK(format_metric_value(42) == "42");
    CHECK(format_metric_value(-7) == "-7");
    CHECK(format_metric_value(9007199254740991.0) == "9007199254740991");  // 2^53 - 1
    CHECK(format_metric_value(0.1) == "0.1");
    CHECK(format_metric_value(2.5) == "2.5");
    CHECK(format_metric_value(1.0 / 3) == "0.3333333333333333");
    CHECK(format_metric_value(1e300) == "1e+300");
    CHECK(format_metric_value(std::numeric_limits<double>::infinity()) == "+Inf");
    CHECK(format_metric_value(-std::numeric_limits<double>::infinity()) == "-Inf");
    CHECK(format_metric_value(std::nan("")) == "NaN");
    // From 2^53 on, the round-trip form, whichever to_chars finds shortest.
    std::string big = format_metric_value(9007199254740992.0);
    CHECK(std::stod(big) == 9007199254740992.0);

    metrics_registry r;
    r.declare("g", "", metric_type::gauge);
    r.set("g", {{"k", "inf"}}, std::numeric_limits<double>::infinity());
    r.set("g", {{"k", "frac"}}, 0.001);
    CHECK(r.render() == "# HELP g \n# TYPE g gauge\ng{k=\"inf\"} +Inf\ng{k=\"frac\"} 0.001\n");
  }

  TEST_CASE("latency buckets are the documented seconds and a valid histogram") {
    std::vector<double> b = latency_buckets();
    REQUIRE(b.size() == 19);
    CHECK(b.front() == 0.001);
    CHECK(b.back() == 80);
    metrics_registry r;
    CHECK_NOTHROW(r.declare("lat_seconds", "", metric_type::histogram, b));
  }

  TEST_CASE("misuse throws invalid_argument naming the metric") {
    metrics_registry r;
    r.declare("c_total", "", metric_type::counter);
    r.declare("g", "", metric_type::gauge);
    r.declare("h", "", metric_type::histogram, {1, 2});

    SUBCASE("undeclared names") {
      CHECK_THROWS_WITH_AS(r.add("nope_total", {}), doctest::Contains("'nope_total'"), std::invalid_argument);
      CHECK_THROWS_WITH_AS(r.set("nope", {}, 1), doctest::Contains("not declared"), std::invalid_argument);
      CHECK_THROWS_AS(r.observe("nope", {}, 1), std::invalid_argument);
    }
    SUBCASE("the wrong call for the type") {
      CHECK_THROWS_WITH_AS(r.set("c_total", {}, 1), doctest::Contains("'c_total'"), std::invalid_argument);
      CHECK_THROWS_WITH_AS(r.add("g", {}), doctest::Contains("is a gauge, not a counter"), std::invalid_argument);
      CHECK_THROWS_AS(r.observe("g", {}, 1), std::invalid_argument);
      CHECK_THROWS_AS(r.add("h", {}), std::invalid_argument);
    }
    SUBCASE("a counter only goes up") {
      CHECK_THROWS_WITH_AS(r.add("c_total", {}, -1), doctest::Contains("'c_total'"), std::invalid_argument);
      CHECK_THROWS_AS(r.add("c_total", {}, std::nan("")), std::invalid_argument);
      CHECK_NOTHROW(r.add("c_total", {}, 0));
    }
    SUBCASE("bad metric names") {
      CHECK_THROWS_AS(r.declare("", "", metric_type::counter), std::invalid_argument);
      CHECK_THROWS_AS(r.declare("1abc", "", metric_type::counter), std::invalid_argument);
      CHECK_THROWS_AS(r.declare("a-b", "", metric_type::gauge), std::invalid_argument);
      CHECK_THROWS_AS(r.declare("a b", "", metric_type::gauge), std::invalid_argument);
      CHECK_NOTHROW(r.declare(":ok_name:x9", "", metric_type::gauge));
      CHECK_NOTHROW(r.declare("_ok", "", metric_type::gauge));
    }
    SUBCASE("bad label names") {
      CHECK_THROWS_WITH_AS(r.add("c_total", {{"9x", "v"}}), doctest::Contains("'9x'"), std::invalid_argument);
      CHECK_THROWS_AS(r.add("c_total", {{"a:b", "v"}}), std::invalid_argument);
      CHECK_THROWS_AS(r.add("c_total", {{"", "v"}}), std::invalid_argument);
      CHECK_THROWS_AS(r.add("c_total", {{"a", "1"}, {"a", "2"}}), std::invalid_argument);
      CHECK_THROWS_AS(r.observe("h", {{"le", "1"}}, 1), std::invalid_argument);
      // A bad name that would render like a valid series must not land in it.
      r.add("c_total", {{"a", "x"}, {"b", "y"}});
      CHECK_THROWS_AS(r.add("c_total", {{"a=\"x\",b", "y"}}), std::invalid_argument);
    }
    SUBCASE("bad buckets") {
      CHECK_THROWS_WITH_AS(r.declare("h2", "", metric_type::histogram, {1, 1}), doctest::Contains("'h2'"), std::invalid_argument);
      CHECK_THROWS_AS(r.declare("h3", "", metric_type::histogram, {2, 1}), std::invalid_argument);
      CHECK_THROWS_AS(r.declare("h4", "", metric_type::histogram, {1, std::numeric_limits<double>::infinity()}), std::invalid_argument);
      CHECK_THROWS_AS(r.declare("h5", "", metric_type::histogram, {std::nan("")}), std::invalid_argument);
      CHECK_THROWS_AS(r.declare("g2", "", metric_type::gauge, {1}), std::invalid_argument);
    }
    SUBCASE("a second declaration must agree") {
      CHECK_THROWS_WITH_AS(r.declare("g", "", metric_type::counter), doctest::Contains("already declared as a gauge"), std::invalid_argument);
      CHECK_THROWS_AS(r.declare("h", "", metric_type::histogram, {1, 3}), std::invalid_argument);
      CHECK_NOTHROW(r.declare("g", "other help", metric_type::gauge));
      CHECK_NOTHROW(r.declare("h", "", metric_type::histogram, {1, 2}));
    }
    // Nothing that failed left a series or family behind (the bad-label SUBCASE adds one good
    // series; the others add nothing).
    std::string text = r.render();
    CHECK(text.find("nope") == std::string::npos);
    CHECK(text.find("h2") == std::string::npos);
    CHECK(text.find("9x") == std::string::npos);
    CHECK(text.find("# HELP g \n") != std::string::npos);  // the first help stays
  }

  TEST_CASE("4 threads x 10000 adds give the exact total while another thread renders") {
    metrics_registry r;
    r.declare("hits_total", "", metric_type::counter);
    r.declare("lat_seconds", "", metric_type::histogram, {0.5});
    std::vector<std::thread> threads;
    for (int t = 0; t < 4; ++t)
      threads.emplace_back([&r, t] {
        for (int i = 0; i < 10000; ++i) {
          r.add("hits_total", {{"model", "chat"}});
          if (i % 100 == 0) r.observe("lat_seconds", {{"thread", std::to_string(t)}}, 0.25);
        }
      });
    std::thread reader([&r] {
      for (int i = 0; i < 50; ++i) (void)r.render();
    });
    for (auto& th : threads) th.join();
    reader.join();
    std::string text = r.render();
    CHECK(text.find("hits_total{model=\"chat\"} 40000\n") != std::string::npos);
    for (int t = 0; t < 4; ++t) CHECK(text.find("lat_seconds_count{thread=\"" + std::to_string(t) + "\"} 100\n") != std::string::npos);
  }
}
