#include "api/ollama_request.h"

#include <doctest/doctest.h>

#include <chrono>
#include <string>

#include "runtime/sampler.h"
#include "tests/api/request_checks.h"

using namespace tandem::api;
using namespace std::chrono_literals;
using tandem::test::bad_request_case;
using tandem::test::check_rejected;
using json = nlohmann::json;

namespace {

const request_limits k_limits;  // cap 4096

ollama_request generate(const std::string& body) { return parse_ollama_generate(json::parse(body), k_limits); }
ollama_request chat(const std::string& body) { return parse_ollama_chat(json::parse(body), k_limits); }

auto parse_generate = [](const json& b) { return parse_ollama_generate(b, k_limits); };
auto parse_chat = [](const json& b) { return parse_ollama_chat(b, k_limits); };

std::optional<keep_alive> keep(const std::string& text) { return parse_keep_alive(json::parse(text)); }

}  // namespace

TEST_SUITE("ollama_request") {
  TEST_CASE("generate: Ollama's defaults") {
    const auto r = generate(R"({"model": "llama3.2", "prompt": "Why is the sky blue?"})");
    CHECK(r.gen.model == "llama3.2");
    CHECK(r.gen.prompt == "Why is the sky blue?");
    CHECK_FALSE(r.gen.suffix);
    CHECK_FALSE(r.system);
    CHECK_FALSE(r.keep_alive);
    CHECK_FALSE(r.raw);
    CHECK_FALSE(r.load_only);
    CHECK(r.gen.stream);  // Ollama streams unless told not to
    CHECK(r.gen.params.max_tokens == -1);
    CHECK_FALSE(r.gen.max_tokens_given);
    const auto& s = r.gen.params.sampling;
    CHECK(s.temperature == doctest::Approx(0.8f));
    CHECK(s.top_k == 40);
    CHECK(s.top_p == doctest::Approx(0.9f));
    CHECK(s.min_p == 0.0f);
    CHECK(s.repeat_penalty == doctest::Approx(1.1f));
    CHECK(s.repeat_last_n == 64);
    CHECK(s.presence_penalty == 0.0f);
    CHECK(s.frequency_penalty == 0.0f);
    CHECK(generate(R"({"model": "m", "prompt": "x"})").gen.params.sampling.seed != s.seed);
    CHECK_NOTHROW(tandem::runtime::sampler{s});
    // The same defaults with an options object that sets nothing.
    const auto empty = generate(R"({"model": "m", "prompt": "x", "options": {}})");
    CHECK(empty.gen.params.sampling.top_k == 40);
    CHECK(empty.gen.params.sampling.repeat_penalty == doctest::Approx(1.1f));
  }

  TEST_CASE("generate: Continue's FIM request") {
    const auto r = generate(R"({"model": "qwen2.5-coder:1.5b", "prompt": "def compute_gcd(a, b):",
        "suffix": "    return result", "raw": false, "stream": false, "keep_alive": 1800,
        "options": {"num_predict": 128, "temperature": 0.01, "top_p": 0.9, "top_k": 20,
                    "stop": ["\n\n", "<|endoftext|>"], "num_ctx": 8192}})");
    CHECK(r.gen.prompt == "def compute_gcd(a, b):");
    CHECK(r.gen.suffix == "    return result");
    CHECK_FALSE(r.gen.stream);
    REQUIRE(r.keep_alive);
    CHECK_FALSE(r.keep_alive->forever);
    CHECK(r.keep_alive->after == 1800s);
    CHECK(r.gen.params.max_tokens == 128);
    CHECK(r.gen.max_tokens_given);
    CHECK(r.gen.params.sampling.temperature == doctest::Approx(0.01f));
    CHECK(r.gen.params.sampling.top_k == 20);
    CHECK(r.gen.params.stop == std::vector<std::string>{"\n\n", "<|endoftext|>"});
    CHECK_FALSE(r.load_only);
  }

  TEST_CASE("generate: every option read") {
    const auto r = generate(R"({"model": "m", "prompt": "p", "system": "be terse", "raw": true,
        "options": {"temperature": 0, "top_k": 0, "top_p": 1, "min_p": 0.1, "seed": 7, "repeat_penalty": 1.0,
                    "repeat_last_n": -1, "presence_penalty": 1.5, "frequency_penalty": -0.5, "num_predict": 0,
                    "num_thread": 4, "num_gpu": 99, "main_gpu": 0, "num_batch": 512, "num_keep": 5,
                    "use_mmap": true, "use_mlock": false, "numa": false, "low_vram": false, "vocab_only": false,
                    "penalize_newline": true, "typical_p": 1.0, "mirostat": 0, "mirostat_tau": 5.0,
                    "mirostat_eta": 0.1, "tfs_z": 1}})");
    const auto& s = r.gen.params.sampling;
    CHECK(s.temperature == 0.0f);
    CHECK(s.top_k == 0);
    CHECK(s.top_p == 1.0f);
    CHECK(s.min_p == doctest::Approx(0.1f));
    CHECK(s.seed == 7u);
    CHECK(s.repeat_penalty == 1.0f);
    CHECK(s.repeat_last_n == -1);
    CHECK(s.presence_penalty == doctest::Approx(1.5f));
    CHECK(s.frequency_penalty == doctest::Approx(-0.5f));
    CHECK(r.gen.params.max_tokens == 0);  // num_predict 0: evaluate the prompt, generate nothing
    CHECK(r.gen.max_tokens_given);
    CHECK(r.system == "be terse");
    CHECK(r.raw);
    CHECK_NOTHROW(tandem::runtime::sampler{s});

    for (const char* unbounded : {"-1", "-2"}) {
      const auto u = generate(std::string(R"({"model": "m", "prompt": "p", "options": {"num_predict": )") + unbounded + "}}");
      CHECK(u.gen.params.max_tokens == -1);
      CHECK_FALSE(u.gen.max_tokens_given);
    }
    CHECK(generate(R"({"model": "m", "prompt": "p", "options": {"num_predict": 4096}})").gen.params.max_tokens == 4096);
    CHECK(generate(R"({"model": "m", "prompt": "p", "options": {"seed": -1}})").gen.params.sampling.seed !=
          generate(R"({"model": "m", "prompt": "p", "options": {"seed": -1}})").gen.params.sampling.seed);
  }

  TEST_CASE("generate: no prompt is a load, or an unload with keep_alive 0") {
    const auto load = generate(R"({"model": "m"})");
    CHECK(load.load_only);
    CHECK_FALSE(load.gen.prompt);
    CHECK(generate(R"({"model": "m", "prompt": ""})").load_only);
    CHECK(generate(R"({"model": "m", "prompt": null})").load_only);
    const auto unload = generate(R"({"model": "m", "keep_alive": 0})");
    CHECK(unload.load_only);
    REQUIRE(unload.keep_alive);
    CHECK_FALSE(unload.keep_alive->forever);
    CHECK(unload.keep_alive->after == 0ms);
    // A suffix alone is FIM at the start of a file, not a load.
    CHECK_FALSE(generate(R"({"model": "m", "prompt": "", "suffix": "return 1"})").load_only);
  }

  TEST_CASE("generate: unknown top-level keys are ignored; empty values of unsupported ones pass") {
    CHECK_NOTHROW(generate(R"({"model": "m", "prompt": "p", "truncate": true, "shift": false, "foo": {"x": 1},
        "format": "", "images": [], "template": "", "context": [], "think": false, "tools": []})"));
    CHECK_NOTHROW(generate(R"({"model": "m", "prompt": "p", "format": null, "images": null, "template": null,
        "context": null, "think": null, "options": null, "keep_alive": null, "stream": null})"));
  }

  TEST_CASE("chat: messages, a system field first, and empty messages as a load") {
    const auto r = chat(R"({"model": "m", "system": "be terse", "messages": [
        {"role": "system", "content": "hello"}, {"role": "user", "content": "hi", "images": []},
        {"role": "assistant"}, {"role": "assistant", "content": null, "thinking": "hm"}],
        "stream": false, "options": {"temperature": 0.2}})");
    REQUIRE(r.gen.messages.size() == 5);
    CHECK(r.gen.messages[0].role == "system");
    CHECK(r.gen.messages[0].content == "be terse");
    CHECK(r.gen.messages[1].content == "hello");
    CHECK(r.gen.messages[2].role == "user");
    CHECK(r.gen.messages[3].content == "");
    CHECK(r.gen.messages[4].content == "");
    CHECK_FALSE(r.system);  // it went into the messages
    CHECK_FALSE(r.load_only);
    CHECK_FALSE(r.gen.stream);
    CHECK(r.gen.params.sampling.temperature == doctest::Approx(0.2f));
    CHECK(r.gen.params.sampling.top_k == 40);

    CHECK(chat(R"({"model": "m", "messages": []})").load_only);
    CHECK(chat(R"({"model": "m"})").load_only);
    const auto unload = chat(R"({"model": "m", "messages": [], "keep_alive": "0"})");
    CHECK(unload.load_only);
    REQUIRE(unload.keep_alive);
    CHECK(unload.keep_alive->after == 0ms);
  }

  TEST_CASE("keep_alive: duration strings, numbers of seconds, negative forever") {
    struct row {
      const char* json;
      bool forever;
      std::chrono::milliseconds after;
    };
    const row rows[] = {
        {R"("10m")", false, 10min},    {R"("24h")", false, 24h},    {R"("1h30m")", false, 90min},
        {R"("300ms")", false, 300ms},  {R"("1.5h")", false, 90min}, {R"("2s500ms")", false, 2500ms},
        {R"("+5m")", false, 5min},     {R"("0")", false, 0ms},      {R"("0s")", false, 0ms},
        {R"("90")", false, 90s},       {R"("1us")", false, 1ms},    {R"("1500000ns")", false, 2ms},
        {R"("1\u00b5s")", false, 1ms}, {R"(".5s")", false, 500ms},  {R"("-1")", true, 0ms},
        {R"("-1m")", true, 0ms},       {R"("-5h")", true, 0ms},     {"0", false, 0ms},
        {"3600", false, 1h},           {"1.5", false, 1500ms},      {"-1", true, 0ms},
        {"-0.5", true, 0ms},           {"1e30", true, 0ms},
    };
    for (const row& r : rows) {
      CAPTURE(std::string(r.json));
      const auto k = keep(r.json);
      REQUIRE(k);
      CHECK(k->forever == r.forever);
      if (!r.forever) CHECK(k->after == r.after);
    }
    CHECK_FALSE(keep("null"));
  }

  TEST_CASE("keep_alive: anything else is refused") {
    for (const char* text :
         {R"("")", R"("abc")", R"("5 m")", R"("m5")", R"("5x")", R"("1h30")", R"(".")", R"("-")", R"("1..5s")", R"("5d")", "true", "[]", "{}"}) {
      const std::string body = std::string(R"({"model": "m", "keep_alive": )") + text + "}";
      CHECK(check_rejected(parse_generate, {body.c_str(), "keep_alive", "keep_alive"}));
    }
  }

  TEST_CASE("generate: refused requests name the field") {
    const bad_request_case cases[] = {
        {R"([])", "", "JSON object"},
        {R"({"prompt": "p"})", "model", "model is required"},
        {R"({"model": "", "prompt": "p"})", "model", "model is required"},
        {R"({"model": 5, "prompt": "p"})", "model", "string"},
        {R"({"model": "m", "prompt": 5})", "prompt", "string"},
        {R"({"model": "m", "prompt": "p", "suffix": ["x"]})", "suffix", "string"},
        {R"({"model": "m", "prompt": "p", "system": 5})", "system", "string"},
        {R"({"model": "m", "prompt": "p", "stream": "no"})", "stream", "boolean"},
        {R"({"model": "m", "prompt": "p", "raw": "yes"})", "raw", "boolean"},
        {R"({"model": "m", "prompt": "p", "options": "x"})", "options", "object"},
        {R"({"model": "m", "prompt": "p", "options": {"foo": 1}})", "options.foo", "Unrecognized"},
        {R"({"model": "m", "prompt": "p", "options": {"temperature": "hot"}})", "options.temperature", "number"},
        {R"({"model": "m", "prompt": "p", "options": {"temperature": -1}})", "options.temperature", "at least 0"},
        {R"({"model": "m", "prompt": "p", "options": {"top_k": 1.5}})", "options.top_k", "integer"},
        {R"({"model": "m", "prompt": "p", "options": {"top_p": 1.1}})", "options.top_p", "between 0 and 1"},
        {R"({"model": "m", "prompt": "p", "options": {"min_p": -1}})", "options.min_p", "between 0 and 1"},
        {R"({"model": "m", "prompt": "p", "options": {"seed": "x"}})", "options.seed", "integer"},
        {R"({"model": "m", "prompt": "p", "options": {"num_predict": -3}})", "options.num_predict", "at least -2"},
        {R"({"model": "m", "prompt": "p", "options": {"num_predict": 10000}})", "options.num_predict", "limit of 4096"},
        {R"({"model": "m", "prompt": "p", "options": {"stop": "x"}})", "options.stop", "array"},
        {R"({"model": "m", "prompt": "p", "options": {"stop": [""]}})", "options.stop[0]", "empty"},
        {R"({"model": "m", "prompt": "p", "options": {"repeat_penalty": 0}})", "options.repeat_penalty", "greater than 0"},
        {R"({"model": "m", "prompt": "p", "options": {"repeat_last_n": -2}})", "options.repeat_last_n", "between -1"},
        {R"({"model": "m", "prompt": "p", "options": {"presence_penalty": 3}})", "options.presence_penalty", "between -2 and 2"},
        {R"({"model": "m", "prompt": "p", "options": {"typical_p": 0.5}})", "options.typical_p", "not supported"},
        {R"({"model": "m", "prompt": "p", "options": {"mirostat": 2}})", "options.mirostat", "not supported"},
        {R"({"model": "m", "prompt": "p", "options": {"tfs_z": 0.9}})", "options.tfs_z", "not supported"},
        {R"({"model": "m", "prompt": "p", "options": {"num_ctx": "big"}})", "options.num_ctx", "integer"},
        {R"({"model": "m", "prompt": "p", "options": {"use_mmap": 1}})", "options.use_mmap", "boolean"},
        {R"({"model": "m", "prompt": "p", "format": "yaml"})", "format", "must be \"json\" or a JSON schema"},
        {R"({"model": "m", "prompt": "p", "format": 3})", "format", "must be \"json\" or a JSON schema"},
        {R"({"model": "m", "prompt": "p", "images": ["iVBORw0KGgo="]})", "images", "not supported"},
        {R"({"model": "m", "prompt": "p", "images": "x"})", "images", "array"},
        {R"({"model": "m", "prompt": "p", "template": "{{ .Prompt }}"})", "template", "not supported"},
        {R"({"model": "m", "prompt": "p", "context": [1, 2, 3]})", "context", "not supported"},
        {R"({"model": "m", "prompt": "p", "think": true})", "think", "not supported"},
    };
    int refused = 0;
    for (const auto& c : cases) refused += check_rejected(parse_generate, c);
    CHECK(refused == int(std::size(cases)));
  }

  TEST_CASE("chat: refused requests name the field") {
    const bad_request_case cases[] = {
        {R"({"messages": [{"role": "user", "content": "x"}]})", "model", "model is required"},
        {R"({"model": "m", "messages": "x"})", "messages", "array"},
        {R"({"model": "m", "messages": [1]})", "messages[0]", "object"},
        {R"({"model": "m", "messages": [{"content": "x"}]})", "messages[0].role", "required"},
        {R"({"model": "m", "messages": [{"role": "tool", "content": "42"}]})", "messages[0].role", "not supported"},
        {R"({"model": "m", "messages": [{"role": "developer", "content": "x"}]})", "messages[0].role", "must be one of"},
        {R"({"model": "m", "messages": [{"role": "user", "content": 5}]})", "messages[0].content", "string"},
        {R"({"model": "m", "messages": [{"role": "user", "content": [{"type": "text", "text": "x"}]}]})", "messages[0].content", "string"},
        {R"({"model": "m", "messages": [{"role": "user", "content": "x", "images": ["aGk="]}]})", "messages[0].images", "not supported"},
        {R"({"model": "m", "messages": [{"role": "user", "content": "x"}, {"role": "assistant", "content": "",
            "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}]})",
         "messages[1].tool_calls", "not supported"},
        {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]})", "tools", "not supported"},
        {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "format": ["json"]})", "format", "must be"},
        {R"({"model": "m", "messages": [{"role": "user", "content": "x"}], "options": {"bogus": true}})", "options.bogus", "Unrecognized"},
        {R"({"model": "m", "system": 1, "messages": []})", "system", "string"},
    };
    int refused = 0;
    for (const auto& c : cases) refused += check_rejected(parse_chat, c);
    CHECK(refused == int(std::size(cases)));
  }
}
