#include "api/infill_request.h"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "runtime/sampler.h"
#include "tests/api/request_checks.h"

using namespace tandem::api;
using tandem::test::bad_request_case;
using tandem::test::check_rejected;
using json = nlohmann::json;

namespace {

const request_limits k_limits;  // cap 4096

infill_request infill(const std::string& body) { return parse_infill(json::parse(body), k_limits); }
auto parse = [](const json& b) { return parse_infill(b, k_limits); };

}  // namespace

TEST_SUITE("infill_request") {
  TEST_CASE("llama.cpp's defaults") {
    const auto r = infill(R"({"input_prefix": "int main() {", "input_suffix": "}"})");
    CHECK(r.gen.model == "");
    CHECK(r.input_prefix == "int main() {");
    CHECK(r.input_suffix == "}");
    CHECK(r.prompt == "");
    CHECK(r.input_extra.empty());
    CHECK_FALSE(r.gen.prompt);
    CHECK_FALSE(r.gen.suffix);
    CHECK(r.gen.params.max_tokens == -1);
    CHECK_FALSE(r.gen.max_tokens_given);
    CHECK_FALSE(r.gen.stream);
    CHECK(r.cache_prompt);
    CHECK(r.t_max_predict_ms == 0);
    CHECK(r.t_max_prompt_ms == 0);
    CHECK(r.n_indent == 0);
    CHECK(r.id_slot == -1);
    CHECK(r.samplers.empty());
    CHECK(r.response_fields.empty());
    const auto& s = r.gen.params.sampling;
    CHECK(s.temperature == doctest::Approx(0.8f));
    CHECK(s.top_k == 40);
    CHECK(s.top_p == doctest::Approx(0.95f));
    CHECK(s.min_p == doctest::Approx(0.05f));
    CHECK(s.repeat_penalty == 1.0f);
    CHECK(s.repeat_last_n == 64);
    CHECK(s.presence_penalty == 0.0f);
    CHECK(s.frequency_penalty == 0.0f);
    CHECK(infill(R"({"input_prefix": "", "input_suffix": ""})").gen.params.sampling.seed != s.seed);
    CHECK_NOTHROW(tandem::runtime::sampler{s});
  }

  TEST_CASE("llama.vim's request") {
    const auto r = infill(R"({"id_slot": 0,
        "input_prefix": "def f(x):\n    ", "input_suffix": "\n\nprint(f(2))\n",
        "input_extra": [{"text": "import os\n", "time": 1712345678, "filename": "src/foo.py"}, {"text": "x = 1\n"}],
        "prompt": "ret", "n_predict": 128, "stop": [], "n_indent": 4, "top_k": 40, "top_p": 0.90,
        "samplers": ["top_k", "top_p", "infill"], "stream": false, "cache_prompt": true,
        "t_max_prompt_ms": 500, "t_max_predict_ms": 1000,
        "response_fields": ["content", "timings/prompt_n", "timings/predicted_n", "truncated", "tokens_cached"],
        "model": "qwen-fim"})");
    CHECK(r.gen.model == "qwen-fim");
    CHECK(r.id_slot == 0);
    CHECK(r.input_prefix == "def f(x):\n    ");
    CHECK(r.input_suffix == "\n\nprint(f(2))\n");
    CHECK(r.prompt == "ret");
    REQUIRE(r.input_extra.size() == 2);
    CHECK(r.input_extra[0].filename == "src/foo.py");
    CHECK(r.input_extra[0].text == "import os\n");
    CHECK(r.input_extra[1].filename == "tmp");  // llama.cpp's name when none is given
    CHECK(r.gen.params.max_tokens == 128);
    CHECK(r.gen.max_tokens_given);
    CHECK(r.gen.params.stop.empty());
    CHECK(r.n_indent == 4);
    CHECK(r.gen.params.sampling.top_p == doctest::Approx(0.9f));
    CHECK(r.samplers == std::vector<std::string>{"top_k", "top_p", "infill"});
    CHECK(r.t_max_prompt_ms == 500);
    CHECK(r.t_max_predict_ms == 1000);
    CHECK(r.response_fields.size() == 5);
    CHECK(r.response_fields[1] == "timings/prompt_n");
  }

  TEST_CASE("the warm-up request: n_predict 0 evaluates the prompt only") {
    const auto r = infill(R"({"id_slot": 0, "input_prefix": "", "input_suffix": "",
        "input_extra": [{"text": "chunk", "filename": "a.c"}], "prompt": "", "n_predict": 0, "temperature": 0.0,
        "samplers": [], "stream": false, "cache_prompt": true, "t_max_prompt_ms": 1, "t_max_predict_ms": 1,
        "response_fields": [""]})");
    CHECK(r.gen.params.max_tokens == 0);
    CHECK(r.gen.max_tokens_given);
    CHECK(r.gen.params.sampling.temperature == 0.0f);
    CHECK(r.response_fields == std::vector<std::string>{""});
  }

  TEST_CASE("llama.vscode's extras are ignored; every llama.cpp sampling field is read") {
    const auto r = infill(R"({"input_prefix": "a", "input_suffix": "b", "n_cmpl": 1, "lora": [{"id": 0, "scale": 0.5}],
        "ignore_eos": false, "dry_multiplier": 0, "temperature": 0.2, "top_k": 0, "top_p": 0.99, "min_p": 0,
        "repeat_penalty": 1.1, "repeat_last_n": 128, "presence_penalty": 0.5, "frequency_penalty": 0.25,
        "seed": 123, "stop": ["\n\n"], "stream": true, "cache_prompt": false, "n_predict": -1})");
    const auto& s = r.gen.params.sampling;
    CHECK(s.temperature == doctest::Approx(0.2f));
    CHECK(s.top_k == 0);
    CHECK(s.top_p == doctest::Approx(0.99f));
    CHECK(s.min_p == 0.0f);
    CHECK(s.repeat_penalty == doctest::Approx(1.1f));
    CHECK(s.repeat_last_n == 128);
    CHECK(s.presence_penalty == doctest::Approx(0.5f));
    CHECK(s.frequency_penalty == doctest::Approx(0.25f));
    CHECK(s.seed == 123u);
    CHECK(r.gen.params.stop == std::vector<std::string>{"\n\n"});
    CHECK(r.gen.stream);
    CHECK_FALSE(r.cache_prompt);
    CHECK(r.gen.params.max_tokens == -1);
    CHECK_FALSE(r.gen.max_tokens_given);
    CHECK_NOTHROW(tandem::runtime::sampler{s});
    // seed -1 is llama.cpp's "random".
    CHECK(infill(R"({"input_prefix": "", "input_suffix": "", "seed": -1})").gen.params.sampling.seed !=
          infill(R"({"input_prefix": "", "input_suffix": "", "seed": -1})").gen.params.sampling.seed);
  }

  TEST_CASE("refused requests name the field") {
    const bad_request_case cases[] = {
        {R"("prefix")", "", "JSON object"},
        {R"({"input_suffix": ""})", "input_prefix", "required"},
        {R"({"input_prefix": ""})", "input_suffix", "required"},
        {R"({"input_prefix": "", "input_suffix": 5})", "input_suffix", "string"},
        {R"({"input_prefix": "", "input_suffix": "", "prompt": 5})", "prompt", "string"},
        {R"({"input_prefix": "", "input_suffix": "", "model": 5})", "model", "string"},
        {R"({"input_prefix": "", "input_suffix": "", "input_extra": "x"})", "input_extra", "array"},
        {R"({"input_prefix": "", "input_suffix": "", "input_extra": [1]})", "input_extra[0]", "object"},
        {R"({"input_prefix": "", "input_suffix": "", "input_extra": [{"filename": "a"}]})", "input_extra[0].text", "required"},
        {R"({"input_prefix": "", "input_suffix": "", "input_extra": [{"text": "a", "filename": 3}]})", "input_extra[0].filename", "string"},
        {R"({"input_prefix": "", "input_suffix": "", "n_predict": -2})", "n_predict", "at least -1"},
        {R"({"input_prefix": "", "input_suffix": "", "n_predict": 5000})", "n_predict", "limit of 4096"},
        {R"({"input_prefix": "", "input_suffix": "", "n_predict": "128"})", "n_predict", "integer"},
        {R"({"input_prefix": "", "input_suffix": "", "temperature": "0"})", "temperature", "number"},
        {R"({"input_prefix": "", "input_suffix": "", "top_p": 2})", "top_p", "between 0 and 1"},
        {R"({"input_prefix": "", "input_suffix": "", "top_k": "40"})", "top_k", "integer"},
        {R"({"input_prefix": "", "input_suffix": "", "repeat_penalty": 0})", "repeat_penalty", "greater than 0"},
        {R"({"input_prefix": "", "input_suffix": "", "presence_penalty": 3})", "presence_penalty", "between -2 and 2"},
        {R"({"input_prefix": "", "input_suffix": "", "seed": "x"})", "seed", "integer"},
        {R"({"input_prefix": "", "input_suffix": "", "stop": "\n"})", "stop", "array"},
        {R"({"input_prefix": "", "input_suffix": "", "stop": [""]})", "stop[0]", "empty"},
        {R"({"input_prefix": "", "input_suffix": "", "stream": "false"})", "stream", "boolean"},
        {R"({"input_prefix": "", "input_suffix": "", "cache_prompt": 1})", "cache_prompt", "boolean"},
        {R"({"input_prefix": "", "input_suffix": "", "t_max_predict_ms": -1})", "t_max_predict_ms", "at least 0"},
        {R"({"input_prefix": "", "input_suffix": "", "t_max_prompt_ms": 1.5})", "t_max_prompt_ms", "integer"},
        {R"({"input_prefix": "", "input_suffix": "", "n_indent": -1})", "n_indent", "at least 0"},
        {R"({"input_prefix": "", "input_suffix": "", "id_slot": -2})", "id_slot", "at least -1"},
        {R"({"input_prefix": "", "input_suffix": "", "samplers": "top_k"})", "samplers", "array"},
        {R"({"input_prefix": "", "input_suffix": "", "samplers": [1]})", "samplers[0]", "string"},
        {R"({"input_prefix": "", "input_suffix": "", "response_fields": [null]})", "response_fields[0]", "string"},
        {R"({"input_prefix": "", "input_suffix": "", "n_cmpl": 17})", "n_cmpl", "n_cmpl"},
        {R"({"input_prefix": "", "input_suffix": "", "n_cmpl": 0})", "n_cmpl", "between 1 and 16"},
    };
    int refused = 0;
    for (const auto& c : cases) refused += check_rejected(parse, c);
    CHECK(refused == int(std::size(cases)));
  }
}
