// Structured output through the real server: OpenAI's response_format (json_object and
// json_schema, whole and streamed), llama.cpp's grammar on /v1/completions and /completion,
// llama.cpp's json_schema, and Ollama's format. Outputs of the stories model are checked to be
// in the language asked for; properties come in the schema's order.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "bench/http_client.h"
#include "tests/api/served_fixture.h"

using nlohmann::json;
using tandem::bench::http_call;
using tandem::test::eventually;

namespace {

constexpr const char* k_schema = R"({"type": "object", "properties": {
  "zeta": {"type": "string", "maxLength": 10}, "alpha": {"type": "integer"}, "mid": {"enum": ["x", "y"]}},
  "required": ["zeta", "alpha", "mid"]})";

// The text of every "data:" event's choices[0] (delta.content or text), concatenated.
std::string streamed_text(const std::string& body) {
  std::string out;
  size_t at = 0;
  while ((at = body.find("data: ", at)) != std::string::npos) {
    const size_t end = body.find("\n\n", at);
    const std::string data = body.substr(at + 6, end - at - 6);
    at = end;
    if (data == "[DONE]") break;
    const auto j = json::parse(data, nullptr, false);
    if (j.is_discarded() || !j.contains("choices") || j["choices"].empty()) continue;
    const auto& c = j["choices"][0];
    if (c.contains("delta") && c["delta"].contains("content") && c["delta"]["content"].is_string()) out += c["delta"]["content"].get<std::string>();
    if (c.contains("text")) out += c["text"].get<std::string>();
  }
  return out;
}

void check_record(const std::string& text) {
  CAPTURE(text);
  const auto doc = nlohmann::ordered_json::parse(text, nullptr, false);
  REQUIRE(!doc.is_discarded());
  REQUIRE(doc.is_object());
  std::vector<std::string> keys;
  for (const auto& [k, v] : doc.items()) keys.push_back(k);
  CHECK(keys == std::vector<std::string>{"zeta", "alpha", "mid"});  // the schema's order, not sorted
  CHECK(doc["zeta"].is_string());
  CHECK(doc["alpha"].is_number_integer());
  CHECK((doc["mid"] == "x" || doc["mid"] == "y"));
}

}  // namespace

TEST_SUITE("server") {
  TEST_CASE("response_format json_schema and json_object on chat, whole and streamed") {
    tandem::test::served_fixture f;
    REQUIRE(eventually([&] { return http_call(f.port, "GET", "/health").status == 200; }));
    for (int seed = 1; seed <= 3; ++seed) {
      json body{{"model", "stories"}, {"messages", {{{"role", "user"}, {"content", "A record, please."}}}}, {"max_tokens", 200}, {"seed", seed}};
      std::string text = body.dump();
      text.insert(text.size() - 1, std::string(R"(,"response_format":{"type":"json_schema","json_schema":{"name":"record","strict":true,"schema":)") +
                                       k_schema + "}}");
      const auto r = http_call(f.port, "POST", "/v1/chat/completions", text);
      REQUIRE(r.status == 200);
      const auto j = json::parse(r.body);
      if (j["choices"][0]["finish_reason"] == "length") continue;
      CHECK(j["choices"][0]["finish_reason"] == "stop");
      check_record(j["choices"][0]["message"]["content"].get<std::string>());
    }
    json streamed{{"model", "stories"}, {"messages", {{{"role", "user"}, {"content", "An object."}}}},
                  {"max_tokens", 200},  {"seed", 4},
                  {"stream", true},     {"response_format", {{"type", "json_object"}}}};
    const auto r = http_call(f.port, "POST", "/v1/chat/completions", streamed.dump());
    REQUIRE(r.status == 200);
    const std::string text = streamed_text(r.body);
    if (r.body.find("\"finish_reason\":\"length\"") == std::string::npos) {
      const auto doc = json::parse(text, nullptr, false);
      CHECK_MESSAGE(doc.is_object(), text);
    }
  }

  TEST_CASE("grammar on /v1/completions and /completion, json_schema on /completion, format on Ollama") {
    tandem::test::served_fixture f;
    REQUIRE(eventually([&] { return http_call(f.port, "GET", "/health").status == 200; }));
    const std::string gbnf = R"(root ::= " " ("yes" | "no") "!")";
    const auto c = json::parse(
        http_call(f.port, "POST", "/v1/completions", json{{"model", "stories"}, {"prompt", "Once"}, {"max_tokens", 20}, {"grammar", gbnf}}.dump())
            .body);
    const std::string text = c["choices"][0]["text"].get<std::string>();
    CHECK((text == " yes!" || text == " no!"));
    CHECK(c["choices"][0]["finish_reason"] == "stop");

    const auto l = http_call(f.port, "POST", "/completion", json{{"prompt", "Once"}, {"n_predict", 20}, {"grammar", gbnf}}.dump());
    REQUIRE(l.status == 200);
    const auto lj = json::parse(l.body);
    CHECK((lj["content"] == " yes!" || lj["content"] == " no!"));
    CHECK(lj["model"] == "stories");
    CHECK(lj["stop"] == true);

    std::string js = json{{"prompt", "Once"}, {"n_predict", 200}, {"seed", 3}, {"temperature", 0.8}}.dump();
    js.insert(js.size() - 1, std::string(R"(,"json_schema":)") + k_schema);
    const auto s = json::parse(http_call(f.port, "POST", "/completion", js).body);
    if (s["stop_type"] != "limit") check_record(s["content"].get<std::string>());

    std::string og = json{{"model", "stories"}, {"prompt", "A record"}, {"stream", false}, {"options", {{"num_predict", 200}, {"seed", 5}}}}.dump();
    og.insert(og.size() - 1, std::string(R"(,"format":)") + k_schema);
    const auto o = json::parse(http_call(f.port, "POST", "/api/generate", og).body);
    if (o["done_reason"] != "length") check_record(o["response"].get<std::string>());
    const auto oc = json::parse(http_call(f.port, "POST", "/api/chat",
                                          json{{"model", "stories"},
                                               {"messages", {{{"role", "user"}, {"content", "hi"}}}},
                                               {"stream", false},
                                               {"format", "json"},
                                               {"options", {{"num_predict", 200}, {"seed", 6}}}}
                                              .dump())
                                    .body);
    if (oc["done_reason"] != "length") CHECK(json::parse(oc["message"]["content"].get<std::string>(), nullptr, false).is_object());
  }
}
