// Shared by the request parser tests: one table row per request that must be refused, and the
// check that the parser refused it the way the route will report it.
#pragma once

#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <string>

#include "api/api_error.h"

namespace tandem::test {

struct bad_request_case {
  const char* body;   // JSON text
  const char* param;  // the api_error's param: the offending field's path
  const char* word;   // a piece of the message
};

// Runs parse on the case's body and checks it throws a 400 invalid_request_error naming the
// field. Returns whether it did, so callers can count.
template <class Parse>
bool check_rejected(Parse parse, const bad_request_case& c) {
  const std::string text = c.body;
  CAPTURE(text);
  const auto body = nlohmann::json::parse(text);
  try {
    parse(body);
  } catch (const api::api_error& e) {
    const std::string message = e.what();
    CAPTURE(message);
    CHECK(e.status == 400);
    CHECK(e.type == "invalid_request_error");
    CHECK(e.param == c.param);
    CHECK(message.find(c.word) != std::string::npos);
    return true;
  }
  FAIL_CHECK("accepted a request that should be refused");
  return false;
}

}  // namespace tandem::test
