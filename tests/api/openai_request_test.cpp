#include "api/openai_request.h"

#include <doctest/doctest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "runtime/sampler.h"
#include "tests/api/request_checks.h"

using namespace tandem::api;
using tandem::test::bad_request_case;
using tandem::test::check_rejected;
using json = nlohmann::json;

namespace {

const request_limits k_limits;  // max_tokens cap 4096

parsed_generation completion(const std::string& body) { return parse_completion_request(json::parse(body), k_limits); }
parsed_generation chat(const std::string& body) { return parse_chat_request(json::parse(body), k_limits); }

auto parse_completion = [](const json& b) { return parse_completion_request(b, k_limits); };
auto parse_chat = [](const json& b) { return parse_chat_request(b, k_limits); };

// Requests both routes must refuse the same way; each body gets the route's required field
// spliced in front of the rest.
const bad_request_case k_common_bad[] = {
    {R"({"temperature": "0.5"})", "temperature", "must be a number"},
    {R"({"temperature": 2.5})", "temperature", "between 0 and 2"},
    {R"({"temperature": -0.1})", "temperature", "between 0 and 2"},
    {R"({"top_p": 1.5})", "top_p", "between 0 and 1"},
    {R"({"top_k": -2})", "top_k", "between -1 and"},
    {R"({"top_k": 1.5})", "top_k", "integer"},
    {R"({"min_p": -0.1})", "min_p", "between 0 and 1"},
    {R"({"presence_penalty": 2.5})", "presence_penalty", "between -2 and 2"},
    {R"({"frequency_penalty": -3})", "frequency_penalty", "between -2 and 2"},
    {R"({"repetition_penalty": 0})", "repetition_penalty", "greater than 0"},
    {R"({"repeat_penalty": -1})", "repeat_penalty", "greater than 0"},
    {R"({"seed": "1"})", "seed", "integer"},
    {R"({"seed": 1.5})", "seed", "integer"},
    {R"({"max_tokens": 0})", "max_tokens", "at least 1"},
    {R"({"max_tokens": -5})", "max_tokens", "at least 1"},
    {R"({"max_tokens": 5000})", "max_tokens", "limit of 4096"},
    {R"({"max_tokens": true})", "max_tokens", "integer"},
    {R"({"stop": 5})", "stop", "string or an array"},
    {R"({"stop": ["a", "b", "c", "d", "e"]})", "stop", "at most 4"},
    {R"({"stop": [""]})", "stop[0]", "empty"},
    {R"({"stop": ""})", "stop", "empty"},
    {R"({"stop": ["a", 1]})", "stop[1]", "string"},
    {R"({"stream": "yes"})", "stream", "boolean"},
    {R"({"stream": 1})", "stream", "boolean"},
    {R"({"stream_options": {"include_usage": true}})", "stream_options", "only be set when stream is true"},
    {R"({"stream": false, "stream_options": {}})", "stream_options", "stream is true"},
    {R"({"stream": true, "stream_options": {"include_usage": "y"}})", "stream_options.include_usage", "boolean"},
    {R"({"stream": true, "stream_options": {"foo": 1}})", "stream_options.foo", "Unrecognized request argument"},
    {R"({"stream": true, "stream_options": "x"})", "stream_options", "object"},
    {R"({"n": 2})", "n", "only n=1"},
    {R"({"n": 0})", "n", "only n=1"},
    {R"({"n": "1"})", "n", "integer"},
    {R"({"logit_bias": {"50256": -100}})", "logit_bias", "not supported"},
    {R"({"logit_bias": [1]})", "logit_bias", "object"},
    {R"({"response_format": {"type": "xml"}})", "response_format.type", "must be"},
    {R"({"response_format": {"type": "json_schema"}})", "response_format.json_schema", "is required"},
    {R"({"response_format": {"type": "json_schema", "json_schema": {"schema": {}}}})", "response_format.json_schema.name", "required"},
    {R"({"response_format": {"type": "json_schema", "json_schema": {"name": "a b", "schema": {}}}})", "response_format.json_schema.name", "1 to 64"},
    {R"({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": []}}})", "response_format.json_schema.schema",
     "must be an object"},
    {R"({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}, "extra": 1}}})", "response_format.json_schema.extra",
     ""},
    {R"({"response_format": {"type": "json_object"}, "grammar": "root ::= \"a\""})", "grammar", "both constrain the output"},
    {R"({"json_schema": 3})", "json_schema", "must be an object"},
    {R"({"grammar": 3})", "grammar", ""},
    {R"({"response_format": {"type": "xml"}})", "response_format.type", "\"text\""},
    {R"({"response_format": {}})", "response_format.type", "required"},
    {R"({"response_format": "text"})", "response_format", "object"},
    {R"({"foo": 1})", "foo", "Unrecognized request argument supplied: foo"},
    {R"({"reasoning_effort": "high"})", "reasoning_effort", "not supported"},
    {R"({"modalities": ["text", "audio"]})", "modalities", "text"},
    {R"({"n_probs": 3})", "n_probs", "not supported"},
    {R"({"user": 5})", "user", "string"},
    {R"({"store": "no"})", "store", "boolean"},
    {R"({"id_slot": "a"})", "id_slot", "integer"},
    {R"({"prediction": "text"})", "prediction", "object"},
    {R"({"prediction": {"content": "x"}})", "prediction.type", "required"},
    {R"({"prediction": {"type": "text", "content": "x"}})", "prediction.type", "\"content\""},
    {R"({"prediction": {"type": "content"}})", "prediction.content", "required"},
    {R"({"prediction": {"type": "content", "content": 5}})", "prediction.content", "string or an array"},
    {R"({"prediction": {"type": "content", "content": [{"type": "image_url"}]}})", "prediction.content", "only text"},
    {R"({"prediction": {"type": "content", "content": "x", "extra": 1}})", "prediction.extra", "Unrecognized"},
    {R"({"speculate": "no"})", "speculate", "boolean"},
    {R"({"speculate": 0})", "speculate", "boolean"},
};

// body + the fields of `extra` (which win on a clash).
std::string merged(const std::string& body, const char* extra) {
  json b = json::parse(body);
  b.update(json::parse(extra));
  return b.dump();
}

}  // namespace

TEST_SUITE("openai_request") {
  TEST_CASE("completions: defaults are OpenAI's") {
    const auto g = completion(R"({"model": "m", "prompt": "hi"})");
    CHECK(g.model == "m");
    CHECK(g.prompt == "hi");
    CHECK_FALSE(g.prompt_tokens);
    CHECK_FALSE(g.suffix);
    CHECK(g.messages.empty());
    CHECK(g.params.max_tokens == 16);
    CHECK_FALSE(g.max_tokens_given);
    CHECK_FALSE(g.stream);
    CHECK_FALSE(g.include_usage);
    CHECK(g.params.stop.empty());
    CHECK(g.params.stop_at_eog);
    const auto& s = g.params.sampling;
    CHECK(s.temperature == 1.0f);
    CHECK(s.top_p == 1.0f);
    CHECK(s.top_k == 0);
    CHECK(s.min_p == 0.0f);
    CHECK(s.repeat_penalty == 1.0f);
    CHECK(s.presence_penalty == 0.0f);
    CHECK(s.frequency_penalty == 0.0f);
    // No seed: a random one each time (equal by chance once in 2^64).
    CHECK(completion(R"({"model": "m", "prompt": "hi"})").params.sampling.seed != s.seed);
    CHECK_NOTHROW(tandem::runtime::sampler{s});
  }

  TEST_CASE("completions: the four prompt forms") {
    CHECK(completion(R"({"model": "m", "prompt": ""})").prompt == "");
    CHECK(completion(R"({"model": "m", "prompt": ["one"]})").prompt == "one");
    const auto tokens = completion(R"({"model": "m", "prompt": [1, 2, 2147483647]})");
    CHECK_FALSE(tokens.prompt);
    CHECK(tokens.prompt_tokens == std::vector<int32_t>{1, 2, 2147483647});
    CHECK(completion(R"({"model": "m", "prompt": [[4, 5.0]]})").prompt_tokens == std::vector<int32_t>{4, 5});
    const auto fim = completion(R"({"model": "m", "prompt": "def f(", "suffix": "\n  return x"})");
    CHECK(fim.suffix == "\n  return x");
    CHECK_FALSE(completion(R"({"model": "m", "prompt": "x", "suffix": null})").suffix);
  }

  TEST_CASE("completions: every field read, at the edges of its range") {
    const auto g = completion(R"({"model": "m", "prompt": "p", "temperature": 0, "top_p": 0, "top_k": 5,
        "min_p": 1, "presence_penalty": -2, "frequency_penalty": 2, "repetition_penalty": 1.3, "seed": 42,
        "max_tokens": 4096, "stop": ["a", "b", "c", "d"], "stream": true,
        "stream_options": {"include_usage": true, "continuous_usage_stats": false}})");
    const auto& s = g.params.sampling;
    CHECK(s.temperature == 0.0f);
    CHECK(s.top_p == 0.0f);
    CHECK(s.top_k == 5);
    CHECK(s.min_p == 1.0f);
    CHECK(s.presence_penalty == -2.0f);
    CHECK(s.frequency_penalty == 2.0f);
    CHECK(s.repeat_penalty == doctest::Approx(1.3f));
    CHECK(s.seed == 42u);
    CHECK(g.params.max_tokens == 4096);
    CHECK(g.max_tokens_given);
    CHECK(g.params.stop == std::vector<std::string>{"a", "b", "c", "d"});
    CHECK(g.stream);
    CHECK(g.include_usage);
    CHECK_NOTHROW(tandem::runtime::sampler{s});

    CHECK(completion(R"({"model": "m", "prompt": "p", "max_tokens": 1})").params.max_tokens == 1);
    CHECK(completion(R"({"model": "m", "prompt": "p", "stop": "\n"})").params.stop == std::vector<std::string>{"\n"});
    CHECK(completion(R"({"model": "m", "prompt": "p", "stop": []})").params.stop.empty());
    CHECK(completion(R"({"model": "m", "prompt": "p", "top_k": -1})").params.sampling.top_k == 0);
    CHECK(completion(R"({"model": "m", "prompt": "p", "top_k": 0})").params.sampling.top_k == 0);
    CHECK(completion(R"({"model": "m", "prompt": "p", "seed": -5})").params.sampling.seed == static_cast<uint64_t>(-5));
    CHECK(completion(R"({"model": "m", "prompt": "p", "seed": 18446744073709551615})").params.sampling.seed == UINT64_MAX);
    // llama.cpp's name, and vLLM's winning when both come.
    CHECK(completion(R"({"model": "m", "prompt": "p", "repeat_penalty": 1.2})").params.sampling.repeat_penalty == doctest::Approx(1.2f));
    CHECK(completion(R"({"model": "m", "prompt": "p", "repeat_penalty": 1.2, "repetition_penalty": 1.5})").params.sampling.repeat_penalty ==
          doctest::Approx(1.5f));
    // Streaming without options: no usage chunk.
    CHECK_FALSE(completion(R"({"model": "m", "prompt": "p", "stream": true})").include_usage);
  }

  TEST_CASE("logprobs: chat's flag and top_logprobs, completions' count") {
    CHECK(chat(R"({"model": "m", "messages": [{"role": "user", "content": "x"}]})").params.logprobs == -1);
    CHECK(chat(R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": true})").params.logprobs == 0);
    CHECK(chat(R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 20})").params.logprobs == 20);
    CHECK(chat(R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": false, "top_logprobs": 0})").params.logprobs == -1);
    CHECK(completion(R"({"model": "m", "prompt": "p", "logprobs": 5})").params.logprobs == 5);
    CHECK(completion(R"({"model": "m", "prompt": "p", "logprobs": 0})").params.logprobs == 0);
    CHECK(completion(R"({"model": "m", "prompt": "p"})").params.logprobs == -1);
  }

  TEST_CASE("predicted outputs and speculate: read from both routes") {
    const auto g = completion(R"({"model": "m", "prompt": "p", "prediction": {"type": "content", "content": "int x = 1;"}, "speculate": false})");
    CHECK(g.prediction == "int x = 1;");
    CHECK_FALSE(g.params.speculate);
    const auto c = chat(
        R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "prediction": {"type": "content", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}})");
    CHECK(c.prediction == "ab");
    CHECK(c.params.speculate);
    CHECK_FALSE(chat(R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "prediction": null, "speculate": null})").prediction);
  }

  TEST_CASE("null counts as absent for every optional field") {
    const auto g = completion(R"({"model": "m", "prompt": "p", "temperature": null, "top_p": null, "top_k": null,
        "min_p": null, "presence_penalty": null, "frequency_penalty": null, "repetition_penalty": null,
        "repeat_penalty": null, "seed": null, "max_tokens": null, "stop": null, "stream": null,
        "stream_options": null, "n": null, "best_of": null, "echo": null, "logprobs": null, "logit_bias": null,
        "response_format": null, "suffix": null, "user": null, "reasoning_effort": null, "modalities": null})");
    CHECK(g.params.sampling.temperature == 1.0f);
    CHECK(g.params.max_tokens == 16);
    CHECK_FALSE(g.stream);
    const auto c = chat(R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_tokens": null,
        "max_completion_tokens": null, "logprobs": null, "top_logprobs": null, "tools": null, "functions": null,
        "tool_choice": null, "function_call": null})");
    CHECK(c.params.max_tokens == -1);
  }

  TEST_CASE("accepted and ignored: bookkeeping, and values that ask for nothing") {
    CHECK_NOTHROW(completion(R"({"model": "m", "prompt": "p", "user": "u1", "store": false,
        "metadata": {"k": "v"}, "service_tier": "auto", "parallel_tool_calls": true, "cache_prompt": true,
        "id_slot": -1, "n_probs": 0, "modalities": ["text"], "n": 1, "best_of": 1, "echo": false, "logprobs": 0,
        "logit_bias": {}, "response_format": {"type": "text"}})"));
    CHECK_NOTHROW(chat(R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": false,
        "top_logprobs": 0, "tools": [], "functions": [], "tool_choice": "none"})"));
    CHECK_NOTHROW(chat(R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": "auto",
        "function_call": "none"})"));
  }

  TEST_CASE("chat: roles, content parts, and the unbounded default") {
    const auto g = chat(R"({"model": "m", "messages": [
        {"role": "developer", "content": "be brief"},
        {"role": "system", "content": "and kind"},
        {"role": "user", "content": [{"type": "text", "text": "Hello, "}, {"type": "text", "text": "world"}],
         "name": "ann"},
        {"role": "assistant", "content": null},
        {"role": "assistant"},
        {"role": "user", "content": []}]})");
    REQUIRE(g.messages.size() == 6);
    CHECK(g.messages[0].role == "system");  // developer is OpenAI's newer name for it
    CHECK(g.messages[0].content == "be brief");
    CHECK(g.messages[1].role == "system");
    CHECK(g.messages[2].role == "user");
    CHECK(g.messages[2].content == "Hello, world");
    CHECK(g.messages[3].role == "assistant");
    CHECK(g.messages[3].content == "");
    CHECK(g.messages[4].content == "");
    CHECK(g.messages[5].content == "");
    CHECK_FALSE(g.prompt);
    CHECK(g.params.max_tokens == -1);
    CHECK_FALSE(g.max_tokens_given);
    CHECK(g.params.sampling.temperature == 1.0f);
  }

  TEST_CASE("chat: max_completion_tokens takes precedence over max_tokens") {
    const std::string msgs = R"("messages": [{"role": "user", "content": "x"}])";
    auto max_of = [&](const std::string& fields) { return chat("{\"model\": \"m\", " + msgs + fields + "}"); };
    CHECK(max_of(R"(, "max_tokens": 10)").params.max_tokens == 10);
    CHECK(max_of(R"(, "max_completion_tokens": 20)").params.max_tokens == 20);
    const auto both = max_of(R"(, "max_tokens": 10, "max_completion_tokens": 20)");
    CHECK(both.params.max_tokens == 20);
    CHECK(both.max_tokens_given);
    CHECK(max_of(R"(, "max_tokens": 30, "max_completion_tokens": 5)").params.max_tokens == 5);
    // Both are still checked.
    CHECK(check_rejected(parse_chat, {R"({"model": "m", "messages": [{"role": "user", "content": "x"}],
        "max_tokens": 0, "max_completion_tokens": 5})",
                                      "max_tokens", "at least 1"}));
  }

  TEST_CASE("completions: refused requests name the field") {
    const bad_request_case own[] = {
        {R"([1, 2])", "", "JSON object"},
        {R"("text")", "", "JSON object"},
        {R"({"prompt": "hi"})", "model", "you must provide a model parameter"},
        {R"({"model": "", "prompt": "hi"})", "model", "you must provide a model parameter"},
        {R"({"model": null, "prompt": "hi"})", "model", "you must provide a model parameter"},
        {R"({"model": 3, "prompt": "hi"})", "model", "string"},
        {R"({"model": "m"})", "prompt", "required"},
        {R"({"model": "m", "prompt": []})", "prompt", "empty"},
        {R"({"model": "m", "prompt": ["a", "b"]})", "prompt", "only one prompt per request is supported"},
        {R"({"model": "m", "prompt": [[1], [2]]})", "prompt", "only one prompt"},
        {R"({"model": "m", "prompt": [[]]})", "prompt[0]", "empty"},
        {R"({"model": "m", "prompt": [1, -2]})", "prompt[1]", "between 0 and"},
        {R"({"model": "m", "prompt": [1, 2.5]})", "prompt[1]", "integer"},
        {R"({"model": "m", "prompt": [1, "a"]})", "prompt[1]", "integer"},
        {R"({"model": "m", "prompt": [4294967296]})", "prompt[0]", "between 0 and"},
        {R"({"model": "m", "prompt": [[1, null]]})", "prompt[0][1]", "integer"},
        {R"({"model": "m", "prompt": {"a": 1}})", "prompt", "must be a string"},
        {R"({"model": "m", "prompt": [true]})", "prompt", "must be a string"},
        {R"({"model": "m", "prompt": 5})", "prompt", "must be a string"},
        {R"({"model": "m", "prompt": "p", "suffix": 5})", "suffix", "string"},
        {R"({"model": "m", "prompt": "p", "echo": true})", "echo", "not supported"},
        {R"({"model": "m", "prompt": "p", "echo": "no"})", "echo", "boolean"},
        {R"({"model": "m", "prompt": "p", "best_of": 3})", "best_of", "best_of=1"},
        {R"({"model": "m", "prompt": "p", "logprobs": 21})", "logprobs", "20"},
        {R"({"model": "m", "prompt": "p", "logprobs": -1})", "logprobs", "0"},
        {R"({"model": "m", "prompt": "p", "logprobs": true})", "logprobs", "integer"},
        {R"({"model": "m", "prompt": "p", "max_completion_tokens": 5})", "max_completion_tokens", "Unrecognized"},
        {R"({"model": "m", "prompt": "p", "messages": []})", "messages", "Unrecognized"},
        {R"({"model": "m", "prompt": "p", "tools": []})", "tools", "Unrecognized"},
    };
    int refused = 0;
    for (const auto& c : own) refused += check_rejected(parse_completion, c);
    for (const auto& c : k_common_bad) {
      const std::string body = merged(R"({"model": "m", "prompt": "p"})", c.body);
      refused += check_rejected(parse_completion, {body.c_str(), c.param, c.word});
    }
    CHECK(refused == int(std::size(own) + std::size(k_common_bad)));
  }

  TEST_CASE("chat: refused requests name the field") {
    const bad_request_case own[] = {
        {R"({"messages": [{"role": "user", "content": "x"}]})", "model", "you must provide a model parameter"},
        {R"({"model": "m"})", "messages", "required"},
        {R"({"model": "m", "messages": []})", "messages", "empty"},
        {R"({"model": "m", "messages": "hi"})", "messages", "array"},
        {R"({"model": "m", "messages": ["hi"]})", "messages[0]", "object"},
        {R"({"model": "m", "messages": [{"content": "x"}]})", "messages[0].role", "required"},
        {R"({"model": "m", "messages": [{"role": 1, "content": "x"}]})", "messages[0].role", "string"},
        {R"({"model": "m", "messages": [{"role": "tool", "content": "x", "tool_call_id": "c"}]})", "messages[0].role", "not supported"},
        {R"({"model": "m", "messages": [{"role": "user", "content": "x"}, {"role": "function", "content": "x"}]})", "messages[1].role",
         "not supported"},
        {R"({"model": "m", "messages": [{"role": "bot", "content": "x"}]})", "messages[0].role", "must be one of"},
        {R"({"model": "m", "messages": [{"role": "user"}]})", "messages[0].content", "required"},
        {R"({"model": "m", "messages": [{"role": "system", "content": null}]})", "messages[0].content", "required"},
        {R"({"model": "m", "messages": [{"role": "user", "content": 5}]})", "messages[0].content", "string or an array"},
        {R"({"model": "m", "messages": [{"role": "user", "content": [{"type": "image_url",
            "image_url": {"url": "data:image/png;base64,AAAA"}}]}]})",
         "messages[0].content", "only text"},
        {R"({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "a"},
            {"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]})",
         "messages[0].content", "only text"},
        {R"({"model": "m", "messages": [{"role": "user", "content": [{"type": "text"}]}]})", "messages[0].content[0].text", "required"},
        {R"({"model": "m", "messages": [{"role": "user", "content": [{"type": "video"}]}]})", "messages[0].content[0].type", "\"text\""},
        {R"({"model": "m", "messages": [{"role": "user", "content": [{"text": "a"}]}]})", "messages[0].content[0].type", "required"},
        {R"({"model": "m", "messages": [{"role": "user", "content": ["a"]}]})", "messages[0].content[0]", "object"},
        {R"({"model": "m", "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": null,
            "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]})",
         "messages[1].tool_calls", "not supported"},
        {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0})", "max_completion_tokens", "at least 1"},
        {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 9999})", "max_completion_tokens", "4096"},
        {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": 1})", "logprobs", "boolean"},
        {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "top_logprobs": 3})", "top_logprobs", "needs 'logprobs': true"},
        {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "logprobs": true, "top_logprobs": 21})", "top_logprobs", "20"},
        {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function",
            "function": {"name": "f"}}]})",
         "tools", "not supported"},
        {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "functions": [{"name": "f"}]})", "functions", "not supported"},
        {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": "required"})", "tool_choice", "not supported"},
        {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "function",
            "function": {"name": "f"}}})",
         "tool_choice", "not supported"},
        {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "tool_choice": "sometimes"})", "tool_choice", "must be"},
        {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "prompt": "p"})", "prompt",
         "Unrecognized request argument supplied: prompt"},
        {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "echo": false})", "echo", "Unrecognized"},
    };
    int refused = 0;
    for (const auto& c : own) refused += check_rejected(parse_chat, c);
    for (const auto& c : k_common_bad) {
      const std::string body = merged(R"({"model": "m", "messages": [{"role": "user", "content": "x"}]})", c.body);
      refused += check_rejected(parse_chat, {body.c_str(), c.param, c.word});
    }
    CHECK(refused == int(std::size(own) + std::size(k_common_bad)));
  }
}
