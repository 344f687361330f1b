#include "runtime/log.h"

#include <doctest/doctest.h>
#include <spdlog/spdlog.h>

TEST_SUITE("log") {
  TEST_CASE("the module's logger is named for it, registered, and writes where the default logger does") {
    auto& l = tandem::runtime::logger();
    CHECK(l.name() == "runtime");
    CHECK(spdlog::get("runtime").get() == &l);
    CHECK(&tandem::runtime::logger() == &l);
    CHECK(l.sinks() == spdlog::default_logger()->sinks());
  }
}
