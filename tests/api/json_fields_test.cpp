#include "api/json_fields.h"

#include <doctest/doctest.h>

#include <functional>
#include <limits>
#include <string_view>

#include "api/api_error.h"

using namespace tandem::api;
using json = nlohmann::json;

namespace {

// The api_error a call throws; fails the check when it throws nothing.
template <class F>
api_error error_of(F f) {
  try {
    f();
  } catch (const api_error& e) {
    return e;
  }
  FAIL_CHECK("no api_error thrown");
  return api_error(0, "", "");
}

constexpr int64_t k_min = std::numeric_limits<int64_t>::min();
constexpr int64_t k_max = std::numeric_limits<int64_t>::max();

}  // namespace

TEST_SUITE("json_fields") {
  TEST_CASE("paths join with dots and indices") {
    CHECK(field_path("", "model") == "model");
    CHECK(field_path("options", "top_k") == "options.top_k");
    CHECK(index_path("messages", 2) == "messages[2]");
    CHECK(field_path(index_path("messages", 0), "role") == "messages[0].role");
  }

  TEST_CASE("null and absent fields are both not given") {
    const json j = json::parse(R"({"a": null, "b": 1})");
    CHECK(find_field(j, "a") == nullptr);
    CHECK(find_field(j, "missing") == nullptr);
    REQUIRE(find_field(j, "b") != nullptr);
    CHECK(*find_field(j, "b") == 1);
    CHECK_FALSE(optional_string(j, "a"));
    CHECK_FALSE(optional_number(j, "a", 0, 1));
    CHECK_FALSE(optional_integer(j, "a", 0, 1));
    CHECK_FALSE(optional_bool(j, "a"));
    CHECK(optional_object(j, "a") == nullptr);
    CHECK(optional_array(j, "a") == nullptr);
    CHECK_FALSE(optional_string_array(j, "a"));
    const auto e = error_of([&] { require_string(j, "a", "options"); });
    CHECK(e.param == "options.a");
    CHECK(std::string(e.what()) == "'options.a' is required");
  }

  TEST_CASE("wrong types name the field and the type wanted") {
    const json j = json::parse(R"({"s": 1, "n": "0.5", "i": "3", "b": 0, "o": [], "a": {}, "sa": ["x", 2]})");
    struct row {
      std::function<void()> read;
      const char* param;
      const char* message;
    };
    const row rows[] = {
        {[&] { require_string(j, "s"); }, "s", "'s' must be a string"},
        {[&] { optional_number(j, "n", 0, 1); }, "n", "'n' must be a number"},
        {[&] { optional_integer(j, "i", 0, 5); }, "i", "'i' must be an integer"},
        {[&] { optional_bool(j, "b"); }, "b", "'b' must be a boolean"},
        {[&] { optional_object(j, "o", "p"); }, "p.o", "'p.o' must be an object"},
        {[&] { optional_array(j, "a"); }, "a", "'a' must be an array"},
        {[&] { optional_string_array(j, "sa"); }, "sa[1]", "'sa[1]' must be a string"},
        {[&] { optional_seed(j, "n"); }, "n", "'n' must be an integer"},
        {[&] { expect_object(json::array(), ""); }, "", "the request body must be a JSON object"},
    };
    for (const row& r : rows) {
      const auto e = error_of(r.read);
      CHECK(e.status == 400);
      CHECK(e.type == "invalid_request_error");
      CHECK(e.param == r.param);
      CHECK(std::string(e.what()) == r.message);
    }
  }

  TEST_CASE("numbers: inclusive ranges, finite, integers of either JSON kind") {
    const json j = json::parse(R"({"t": 2, "f": 0.5, "big": 18446744073709551615, "neg": -4, "whole": 16.0,
                                   "half": 16.5, "huge": 1e30})");
    CHECK(optional_number(j, "t", 0, 2) == 2.0);
    CHECK(optional_number(j, "f", 0, 1) == 0.5);
    CHECK(std::string(error_of([&] { optional_number(j, "t", 0, 1); }).what()) == "'t' must be between 0 and 1, got 2");
    CHECK(std::string(error_of([&] { optional_number(j, "f", 1, std::numeric_limits<double>::infinity()); }).what()) ==
          "'f' must be at least 1, got 0.5");
    CHECK(std::string(error_of([&] { as_number(json(std::numeric_limits<double>::infinity()), "x", 0, 1); }).what()) ==
          "'x' must be a finite number");
    CHECK(std::string(error_of([&] { as_number(json(std::numeric_limits<double>::quiet_NaN()), "x", 0, 1); }).what()) ==
          "'x' must be a finite number");

    CHECK(optional_integer(j, "neg", -10, 10) == -4);
    CHECK(optional_integer(j, "whole", 0, 100) == 16);  // 16.0: some clients write every number as a double
    CHECK(std::string(error_of([&] { optional_integer(j, "half", 0, 100); }).what()) == "'half' must be an integer");
    CHECK(std::string(error_of([&] { optional_integer(j, "neg", 0, k_max); }).what()) == "'neg' must be at least 0, got -4");
    CHECK(std::string(error_of([&] { optional_integer(j, "t", k_min, 1); }).what()) == "'t' must be at most 1, got 2");
    CHECK(std::string(error_of([&] { optional_integer(j, "big", 0, k_max); }).what()) == "'big' must be at least 0, got 18446744073709551615");
    CHECK(error_of([&] { optional_integer(j, "huge", k_min, k_max); }).param == "huge");
    // Booleans are not numbers.
    CHECK(error_of([&] { as_integer(json(true), "x", 0, 1); }).param == "x");
    CHECK(error_of([&] { as_number(json(false), "x", 0, 1); }).param == "x");
  }

  TEST_CASE("seeds: any 64-bit integer; -1 and absent mean random") {
    const json j = json::parse(R"({"a": 42, "b": -1, "c": -5, "d": 18446744073709551615, "e": 7.0, "f": 1e30})");
    CHECK(optional_seed(j, "a") == 42u);
    CHECK_FALSE(optional_seed(j, "b"));
    CHECK_FALSE(optional_seed(j, "missing"));
    CHECK(optional_seed(j, "c") == static_cast<uint64_t>(-5));
    CHECK(optional_seed(j, "d") == std::numeric_limits<uint64_t>::max());
    CHECK(optional_seed(j, "e") == 7u);
    CHECK(error_of([&] { optional_seed(j, "f"); }).param == "f");
  }

  TEST_CASE("unknown keys are named with their path") {
    const json j = json::parse(R"({"model": "m", "temperature": 1, "zzz": 1})");
    constexpr std::string_view known[] = {"model", "temperature"};
    const auto e = error_of([&] { reject_unknown_keys(j, known, "options"); });
    CHECK(e.param == "options.zzz");
    CHECK(std::string(e.what()) == "Unrecognized request argument supplied: options.zzz");
    constexpr std::string_view all[] = {"model", "temperature", "zzz"};
    CHECK_NOTHROW(reject_unknown_keys(j, all));
  }
}
