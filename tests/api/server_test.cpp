// The real server on 127.0.0.1 with an ephemeral port: every route family, streamed and not,
// admin residency changes visible in /admin/models and /metrics, and the engine left clean.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>
#include <thread>

#include "bench/http_client.h"
#include "served_fixture.h"

using nlohmann::json;
using namespace std::chrono_literals;
using tandem::bench::http_call;
using tandem::bench::http_conn;
using tandem::test::eventually;

namespace {

// The JSON objects of an SSE body ("data: {...}" events), and whether it ended with [DONE].
std::vector<json> sse_events(const std::string& body, bool* done) {
  std::vector<json> out;
  *done = false;
  size_t at = 0;
  while (at < body.size()) {
    const size_t end = body.find("\n\n", at);
    REQUIRE(end != std::string::npos);
    const std::string ev = body.substr(at, end - at);
    REQUIRE(ev.rfind("data: ", 0) == 0);
    const std::string data = ev.substr(6);
    if (data == "[DONE]")
      *done = true;
    else
      out.push_back(json::parse(data));
    at = end + 2;
  }
  return out;
}

std::vector<json> ndjson_lines(const std::string& body) {
  std::vector<json> out;
  size_t at = 0;
  while (at < body.size()) {
    const size_t end = body.find('\n', at);
    REQUIRE(end != std::string::npos);
    out.push_back(json::parse(body.substr(at, end - at)));
    at = end + 1;
  }
  return out;
}

json model_entry(uint16_t port, const std::string& name) {
  const auto r = http_call(port, "GET", "/admin/models");
  REQUIRE(r.status == 200);
  const json all = json::parse(r.body);  // kept: a range-for over a temporary's member dangles
  for (const auto& m : all["models"])
    if (m["name"] == name) return m;
  FAIL("no model " << name);
  return {};
}

void check_clean(tandem::test::served_fixture& f) {
  f.served->executor().drain();
  for (const auto& m : f.served->models()) CHECK(f.served->executor().kv_blocks_in_use(m->name()) == 0);
  f.served->arbiter().check_integrity();
}

}  // namespace

TEST_SUITE("server") {
  TEST_CASE("health, model listing, and OpenAI completions whole and streamed give the same text") {
    tandem::test::served_fixture f;
    CHECK(eventually([&] { return http_call(f.port, "GET", "/health").status == 200; }));
    const auto models = json::parse(http_call(f.port, "GET", "/v1/models").body);
    REQUIRE(models["data"].size() == 3);
    CHECK(models["data"][0]["id"] == "stories");
    CHECK(models["data"][0]["object"] == "model");
    CHECK(models["data"][0]["tandem"]["state"] == "device");  // preloaded
    CHECK(models["data"][0]["max_model_len"] == 256);
    CHECK(http_call(f.port, "GET", "/v1/models/default").status == 200);  // an alias
    CHECK(http_call(f.port, "GET", "/v1/models/nope").status == 404);

    const json req{{"model", "stories"}, {"prompt", "Once upon a time"}, {"max_tokens", 12}, {"temperature", 0}};
    const auto whole = http_call(f.port, "POST", "/v1/completions", req.dump());
    REQUIRE(whole.status == 200);
    const auto w = json::parse(whole.body);
    CHECK(w["object"] == "text_completion");
    CHECK(w["id"].get<std::string>().rfind("cmpl-", 0) == 0);
    const std::string text = w["choices"][0]["text"];
    CHECK(!text.empty());
    CHECK(w["choices"][0]["finish_reason"] == "length");
    CHECK(w["usage"]["completion_tokens"] == 12);
    CHECK(w["usage"]["total_tokens"] == w["usage"]["prompt_tokens"].get<int>() + 12);

    json sreq = req;
    sreq["stream"] = true;
    sreq["stream_options"] = {{"include_usage", true}};
    const auto streamed = http_call(f.port, "POST", "/v1/completions", sreq.dump());
    REQUIRE(streamed.status == 200);
    CHECK(streamed.headers.at("content-type") == "text/event-stream");
    bool done = false;
    const auto events = sse_events(streamed.body, &done);
    CHECK(done);
    REQUIRE(events.size() >= 3);
    std::string joined;
    for (size_t i = 0; i + 1 < events.size(); ++i) {
      CHECK(events[i]["object"] == "text_completion");
      CHECK(events[i].contains("usage"));
      CHECK(events[i]["usage"].is_null());
      if (!events[i]["choices"].empty()) joined += events[i]["choices"][0]["text"].get<std::string>();
    }
    CHECK(events[events.size() - 2]["choices"][0]["finish_reason"] == "length");
    CHECK(events.back()["choices"].empty());
    CHECK(events.back()["usage"]["completion_tokens"] == 12);
    CHECK(joined == text);
    check_clean(f);
  }

  TEST_CASE("chat completions: the plain template, the role chunk first, and stop strings") {
    tandem::test::served_fixture f;
    const json req{{"model", "stories"},
                   {"messages", {{{"role", "system"}, {"content", "Tell a story."}}, {{"role", "user"}, {"content", "Once upon a time"}}}},
                   {"max_completion_tokens", 10},
                   {"temperature", 0}};
    const auto whole = http_call(f.port, "POST", "/v1/chat/completions", req.dump());
    REQUIRE(whole.status == 200);
    const auto w = json::parse(whole.body);
    CHECK(w["object"] == "chat.completion");
    CHECK(w["choices"][0]["message"]["role"] == "assistant");
    const std::string content = w["choices"][0]["message"]["content"];

    json sreq = req;
    sreq["stream"] = true;
    const auto streamed = http_call(f.port, "POST", "/v1/chat/completions", sreq.dump());
    bool done = false;
    const auto events = sse_events(streamed.body, &done);
    CHECK(done);
    REQUIRE(events.size() >= 2);
    CHECK(events[0]["object"] == "chat.completion.chunk");
    CHECK(events[0]["choices"][0]["delta"]["role"] == "assistant");
    CHECK(!events[0].contains("usage"));  // only with include_usage
    std::string joined;
    for (const auto& e : events) joined += e["choices"][0]["delta"].value("content", "");
    CHECK(joined == content);
    CHECK(events.back()["choices"][0]["finish_reason"] == "length");

    // A stop string cut from the whole text ends it there with finish_reason "stop".
    if (content.size() > 4) {
      json stop_req = req;
      const std::string stop = content.substr(content.size() / 2, 2);
      stop_req["stop"] = stop;
      const auto s = json::parse(http_call(f.port, "POST", "/v1/chat/completions", stop_req.dump()).body);
      CHECK(s["choices"][0]["finish_reason"] == "stop");
      CHECK(s["choices"][0]["message"]["content"] == content.substr(0, content.find(stop)));
    }
    check_clean(f);
  }

  TEST_CASE("logprobs: chat and completions, whole and streamed, consistent with the tokens sampled") {
    tandem::test::served_fixture f;
    const json req{{"model", "stories"},
                   {"messages", {{{"role", "user"}, {"content", "Once upon a time"}}}},
                   {"max_completion_tokens", 12},
                   {"temperature", 0},
                   {"logprobs", true},
                   {"top_logprobs", 3}};
    const auto whole = json::parse(http_call(f.port, "POST", "/v1/chat/completions", req.dump()).body);
    const auto& content = whole["choices"][0]["logprobs"]["content"];
    REQUIRE(content.is_array());
    CHECK(content.size() == whole["usage"]["completion_tokens"]);
    std::string spelled;
    for (const auto& e : content) {
      CHECK(e["logprob"].get<double>() <= 0);
      REQUIRE(e["top_logprobs"].size() == 3);
      // Greedy: the token sampled is the most likely one, with the same log-probability.
      CHECK(e["top_logprobs"][0]["token"] == e["token"]);
      CHECK(e["top_logprobs"][0]["logprob"].get<double>() == doctest::Approx(e["logprob"].get<double>()));
      CHECK(e["top_logprobs"][1]["logprob"].get<double>() <= e["top_logprobs"][0]["logprob"].get<double>());
      CHECK(e["bytes"].size() == e["token"].get<std::string>().size());
      spelled += e["token"].get<std::string>();
    }
    // The tokens spell the answer (SentencePiece's leading space aside).
    CHECK(spelled.find(whole["choices"][0]["message"]["content"].get<std::string>().substr(1)) != std::string::npos);

    json sreq = req;
    sreq["stream"] = true;
    bool done = false;
    const auto events = sse_events(http_call(f.port, "POST", "/v1/chat/completions", sreq.dump()).body, &done);
    CHECK(done);
    json streamed = json::array();
    for (const auto& e : events)
      if (e["choices"][0].contains("logprobs") && e["choices"][0]["logprobs"].is_object())
        for (const auto& x : e["choices"][0]["logprobs"]["content"]) streamed.push_back(x);
    CHECK(streamed == content);

    // Without the flag: null, as OpenAI.
    json plain = req;
    plain.erase("logprobs");
    plain.erase("top_logprobs");
    CHECK(json::parse(http_call(f.port, "POST", "/v1/chat/completions", plain.dump()).body)["choices"][0]["logprobs"].is_null());

    // Completions: the legacy four lists.
    const json creq{{"model", "stories"}, {"prompt", "Once upon a time"}, {"max_tokens", 6}, {"temperature", 0}, {"logprobs", 2}};
    const auto c = json::parse(http_call(f.port, "POST", "/v1/completions", creq.dump()).body);
    const auto& lp = c["choices"][0]["logprobs"];
    REQUIRE(lp["tokens"].size() == c["usage"]["completion_tokens"]);
    CHECK(lp["token_logprobs"].size() == lp["tokens"].size());
    CHECK(lp["top_logprobs"].size() == lp["tokens"].size());
    for (size_t i = 0; i < lp["tokens"].size(); ++i) {
      CHECK(lp["top_logprobs"][i].contains(lp["tokens"][i].get<std::string>()));
      if (i > 0) CHECK(lp["text_offset"][i].get<size_t>() == lp["text_offset"][i - 1].get<size_t>() + lp["tokens"][i - 1].get<std::string>().size());
    }
    check_clean(f);
  }

  TEST_CASE("fill in the middle: OpenAI suffix, /infill whole, streamed and warm-up, and models without FIM tokens") {
    tandem::test::served_fixture f;
    const json c{{"model", "coder"}, {"prompt", "def add(a, b):\n    "}, {"suffix", "\n\nprint(add(1, 2))\n"}, {"max_tokens", 8}, {"temperature", 0}};
    const auto r = http_call(f.port, "POST", "/v1/completions", c.dump());
    REQUIRE(r.status == 200);
    const auto cj = json::parse(r.body);
    CHECK(cj["usage"]["completion_tokens"].get<int>() <= 8);

    json bad = c;
    bad["model"] = "stories";
    const auto nf = http_call(f.port, "POST", "/v1/completions", bad.dump());
    CHECK(nf.status == 400);
    CHECK(json::parse(nf.body)["error"]["param"] == "suffix");

    // /infill without a model goes to the code model with FIM tokens.
    const json in{{"input_prefix", "def add(a, b):\n    "},
                  {"input_suffix", "\n"},
                  {"input_extra", {{{"filename", "util.py"}, {"text", "import os\n"}}}},
                  {"prompt", "return"},
                  {"n_predict", 6},
                  {"temperature", 0},
                  {"samplers", {"top_k", "top_p", "infill"}},
                  {"cache_prompt", true}};
    const auto ir = http_call(f.port, "POST", "/infill", in.dump());
    REQUIRE(ir.status == 200);
    const auto ij = json::parse(ir.body);
    CHECK(ij["model"] == "coder");
    CHECK(ij["stop"] == true);
    CHECK(ij["tokens_predicted"].get<int>() <= 6);
    CHECK(ij["timings"]["prompt_n"].get<int>() > 0);

    json streamed = in;
    streamed["stream"] = true;
    const auto sr = http_call(f.port, "POST", "/infill", streamed.dump());
    REQUIRE(sr.status == 200);
    bool done = false;
    const auto events = sse_events(sr.body, &done);
    CHECK_FALSE(done);  // llama.cpp's native routes end with stop: true, not [DONE]
    REQUIRE(!events.empty());
    std::string joined;
    for (const auto& e : events) joined += e.value("content", "");
    CHECK(events.back()["stop"] == true);
    CHECK(joined == ij["content"].get<std::string>());

    // The plugins' warm-up: prompt only, nothing generated, flattened response fields.
    json warm = in;
    warm["n_predict"] = 0;
    warm["response_fields"] = {"content", "timings/prompt_n", "tokens_predicted"};
    const auto wj = json::parse(http_call(f.port, "POST", "/infill", warm.dump()).body);
    CHECK(wj["content"] == "");
    CHECK(wj["tokens_predicted"] == 0);
    CHECK(wj["timings/prompt_n"].get<int>() > 0);
    CHECK_FALSE(wj.contains("model"));

    // n_indent: no line after the cursor's may be indented less than 1000 characters, so
    // nothing but blank lines follows the first newline.
    json indented = in;
    indented["n_indent"] = 1000;
    indented["n_predict"] = 64;
    const auto nj = json::parse(http_call(f.port, "POST", "/infill", indented.dump()).body);
    const std::string c2 = nj["content"];
    if (const auto nl = c2.find('\n'); nl != std::string::npos) CHECK(c2.find_first_not_of('\n', nl) == std::string::npos);

    json no_fim = in;
    no_fim["model"] = "stories";
    const auto nr = http_call(f.port, "POST", "/infill", no_fim.dump());
    CHECK(nr.status == 400);
    CHECK(json::parse(nr.body)["error"]["message"].get<std::string>().find("fill-in-the-middle") != std::string::npos);
    check_clean(f);
  }

  TEST_CASE("Ollama routes: generate streamed as NDJSON and whole, chat, tags, ps, show, load and unload") {
    tandem::test::served_fixture f;
    const json g{
        {"model", "stories"}, {"prompt", "Once upon a time"}, {"options", {{"temperature", 0}, {"num_predict", 10}, {"repeat_penalty", 1.0}}}};
    const auto s = http_call(f.port, "POST", "/api/generate", g.dump());  // stream defaults to true
    REQUIRE(s.status == 200);
    CHECK(s.headers.at("content-type") == "application/x-ndjson");
    const auto lines = ndjson_lines(s.body);
    REQUIRE(lines.size() >= 2);
    std::string joined;
    for (size_t i = 0; i + 1 < lines.size(); ++i) {
      CHECK(lines[i]["done"] == false);
      joined += lines[i]["response"].get<std::string>();
    }
    CHECK(lines.back()["done"] == true);
    CHECK(lines.back()["done_reason"] == "length");
    CHECK(lines.back()["eval_count"] == 10);

    json whole = g;
    whole["stream"] = false;
    const auto w = json::parse(http_call(f.port, "POST", "/api/generate", whole.dump()).body);
    CHECK(w["response"] == joined);
    // The same greedy continuation as OpenAI's completions route gives.
    const json oai{{"model", "stories"}, {"prompt", "Once upon a time"}, {"max_tokens", 10}, {"temperature", 0}};
    CHECK(json::parse(http_call(f.port, "POST", "/v1/completions", oai.dump()).body)["choices"][0]["text"] == joined);

    const json chat{
        {"model", "stories"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}, {"stream", false}, {"options", {{"num_predict", 4}}}};
    const auto cj = json::parse(http_call(f.port, "POST", "/api/chat", chat.dump()).body);
    CHECK(cj["message"]["role"] == "assistant");
    CHECK(cj["done"] == true);

    const auto tags = json::parse(http_call(f.port, "GET", "/api/tags").body);
    REQUIRE(tags["models"].size() == 3);
    CHECK(tags["models"][0]["name"] == "stories");
    CHECK(tags["models"][0]["details"]["format"] == "gguf");
    CHECK(tags["models"][0]["digest"].get<std::string>().size() == 64);
    const auto show = json::parse(http_call(f.port, "POST", "/api/show", R"({"model":"coder"})").body);
    CHECK(std::find(show["capabilities"].begin(), show["capabilities"].end(), "insert") != show["capabilities"].end());

    auto in_ps = [&](const std::string& name) {
      const json ps = json::parse(http_call(f.port, "GET", "/api/ps").body);
      for (const auto& m : ps["models"])
        if (m["name"] == name) return m["size_vram"].get<uint64_t>() > 0;
      return false;
    };
    CHECK(in_ps("stories"));
    // Ollama's load request, then its unload (keep_alive 0).
    const auto load = json::parse(http_call(f.port, "POST", "/api/generate", R"({"model":"stories-q8"})").body);
    CHECK(load["done_reason"] == "load");
    CHECK(eventually([&] { return in_ps("stories-q8"); }));
    const auto unload = json::parse(http_call(f.port, "POST", "/api/generate", R"({"model":"stories-q8","keep_alive":0})").body);
    CHECK(unload["done_reason"] == "unload");
    CHECK(eventually([&] { return !in_ps("stories-q8"); }));
    const auto missing = http_call(f.port, "POST", "/api/generate", R"({"model":"nope","prompt":"x"})");
    CHECK(missing.status == 404);
    CHECK(json::parse(missing.body)["error"].is_string());  // Ollama's error shape
    check_clean(f);
  }

  TEST_CASE("predicted outputs: the same answer, its tokens counted in the usage as OpenAI does, and in /admin/models and /metrics") {
    tandem::test::served_fixture f;
    const json base{{"model", "stories"},
                    {"messages", json::array({{{"role", "user"}, {"content", "Tell me a story"}}})},
                    {"max_tokens", 40},
                    {"temperature", 0}};
    const auto plain = http_call(f.port, "POST", "/v1/chat/completions", base.dump());
    REQUIRE(plain.status == 200);
    const std::string answer = json::parse(plain.body)["choices"][0]["message"]["content"];
    CHECK_FALSE(json::parse(plain.body)["usage"].contains("completion_tokens_details"));
    // The answer itself, with a wrong ending: most of it accepted, some of it rejected.
    json req = base;
    req["prediction"] = {{"type", "content"}, {"content", answer.substr(0, answer.size() / 2) + " and then a dragon ate the moon"}};
    const auto r = http_call(f.port, "POST", "/v1/chat/completions", req.dump());
    REQUIRE(r.status == 200);
    const auto j = json::parse(r.body);
    CHECK(j["choices"][0]["message"]["content"] == answer);
    const auto& d = j["usage"]["completion_tokens_details"];
    CHECK(d["accepted_prediction_tokens"].get<int>() > 0);
    CHECK(d["rejected_prediction_tokens"].get<int>() >= 0);
    CHECK(d["accepted_prediction_tokens"].get<int>() <= j["usage"]["completion_tokens"].get<int>());
    // Streamed, on /v1/completions, and with speculation turned off: the same text.
    json off = req;
    off["speculate"] = false;
    const auto o = json::parse(http_call(f.port, "POST", "/v1/chat/completions", off.dump()).body);
    CHECK(o["choices"][0]["message"]["content"] == answer);
    CHECK(o["usage"]["completion_tokens_details"]["accepted_prediction_tokens"] == 0);
    json stream = req;
    stream["stream"] = true;
    stream["stream_options"] = {{"include_usage", true}};
    bool done = false;
    const auto events = sse_events(http_call(f.port, "POST", "/v1/chat/completions", stream.dump()).body, &done);
    CHECK(done);
    REQUIRE_FALSE(events.empty());
    std::string joined;
    for (const json& ev : events) {
      if (ev["choices"].empty() || !ev["choices"][0]["delta"].contains("content")) continue;
      const std::string piece = ev["choices"][0]["delta"]["content"];
      joined += piece;
    }
    CHECK(joined == answer);
    CHECK(events.back()["usage"]["completion_tokens_details"]["accepted_prediction_tokens"].get<int>() > 0);
    const json comp{{"model", "stories"}, {"prompt", "Once upon a time"}, {"max_tokens", 30}, {"temperature", 0}};
    const std::string text = json::parse(http_call(f.port, "POST", "/v1/completions", comp.dump()).body)["choices"][0]["text"];
    json pc = comp;
    pc["prediction"] = {{"type", "content"}, {"content", text}};
    const auto pj = json::parse(http_call(f.port, "POST", "/v1/completions", pc.dump()).body);
    CHECK(pj["choices"][0]["text"] == text);
    CHECK(pj["usage"]["completion_tokens_details"]["accepted_prediction_tokens"].get<int>() > 10);
    // Longer than the model's context: refused, naming the field.
    std::string huge;
    for (int i = 0; i < 400; ++i) huge += "and the dog ran ";
    json big = base;
    big["prediction"] = {{"type", "content"}, {"content", huge}};
    const auto b = http_call(f.port, "POST", "/v1/chat/completions", big.dump());
    CHECK(b.status == 400);
    CHECK(json::parse(b.body)["error"]["param"] == "prediction.content");

    const auto spec = model_entry(f.port, "stories")["speculation"];
    CHECK(spec["method"] == "off");
    CHECK(spec["draft"].is_null());
    CHECK(spec["proposed"].get<int>() > 0);
    CHECK(spec["accepted"].get<int>() > 0);
    CHECK(spec["acceptance_rate"].get<double>() > 0);
    CHECK(spec["tokens_per_pass"].get<double>() > 1);
    const auto metrics = http_call(f.port, "GET", "/metrics").body;
    CHECK(metrics.find("# TYPE tandem_spec_proposed_tokens_total counter") != std::string::npos);
    CHECK(metrics.find("tandem_spec_accepted_tokens_total{model=\"stories\"} " + std::to_string(spec["accepted"].get<int>())) != std::string::npos);
    check_clean(f);
  }

  TEST_CASE("admin: evict, load, pin and unpin, visible in /admin/models and /metrics") {
    tandem::test::served_fixture f;
    CHECK(model_entry(f.port, "stories")["state"] == "device");
    REQUIRE(http_call(f.port, "POST", "/admin/models/stories/pin").status == 200);
    CHECK(eventually([&] { return model_entry(f.port, "stories")["pinned"] == true; }));
    CHECK(http_call(f.port, "POST", "/admin/models/stories/evict").status == 409);  // pinned
    REQUIRE(http_call(f.port, "POST", "/admin/models/stories/unpin").status == 200);
    CHECK(eventually([&] { return model_entry(f.port, "stories")["pinned"] == false; }));

    REQUIRE(http_call(f.port, "POST", "/admin/models/coder/load").status == 200);
    CHECK(eventually([&] { return model_entry(f.port, "coder")["state"] == "device"; }));
    const auto coder = model_entry(f.port, "coder");
    CHECK(coder["bytes"]["device"].get<uint64_t>() == coder["bytes"]["weights"].get<uint64_t>());
    CHECK(coder["swap_ins"] == 1);

    REQUIRE(http_call(f.port, "POST", "/admin/models/coder/evict").status == 200);
    CHECK(eventually([&] { return model_entry(f.port, "coder")["bytes"]["device"] == 0; }));
    CHECK(model_entry(f.port, "coder")["swap_outs"] == 1);

    REQUIRE(http_call(f.port, "PATCH", "/admin/models/stories", R"({"priority": 77, "keep_alive": "-1"})").status == 200);
    CHECK(eventually([&] { return model_entry(f.port, "stories")["priority"] == 77; }));
    CHECK(model_entry(f.port, "stories")["keep_alive"] == -1);

    const auto metrics = http_call(f.port, "GET", "/metrics");
    REQUIRE(metrics.status == 200);
    CHECK(metrics.headers.at("content-type").rfind("text/plain", 0) == 0);
    CHECK(metrics.body.find("tandem_model_bytes{model=\"stories\",tier=\"device\"}") != std::string::npos);
    CHECK(metrics.body.find("tandem_swap_ins_total{model=\"coder\"} 1") != std::string::npos);
    CHECK(metrics.body.find("tandem_swap_outs_total{model=\"coder\"} 1") != std::string::npos);
    CHECK(metrics.body.find("# TYPE tandem_time_to_first_token_seconds histogram") != std::string::npos);

    // Evicting a model with a generation in flight: it is swapped out and resumes; nothing is dropped.
    const json long_req{{"model", "stories"}, {"prompt", "Once upon a time"}, {"max_tokens", 120}, {"temperature", 0}};
    const auto alone = json::parse(http_call(f.port, "POST", "/v1/completions", long_req.dump()).body)["choices"][0]["text"];
    http_conn c(f.port);
    json sreq = long_req;
    sreq["stream"] = true;
    c.send("POST", "/v1/completions", sreq.dump());
    REQUIRE(c.read_until("data: "));
    REQUIRE(http_call(f.port, "POST", "/admin/models/stories/evict").status == 200);
    const auto reply = c.reply();
    bool done = false;
    std::string joined;
    for (const auto& e : sse_events(reply.body, &done))
      if (!e["choices"].empty()) joined += e["choices"][0]["text"].get<std::string>();
    CHECK(done);
    CHECK(joined == alone.get<std::string>());
    CHECK(model_entry(f.port, "stories")["swap_outs"].get<int>() >= 1);
    // Its KV went to the host with it and came back: pages moved both ways, and what the pool
    // holds on the device is what the arbiter counts for it.
    const auto st = model_entry(f.port, "stories");
    CHECK(st["kv_pages"]["moved_to_host"].get<int64_t>() >= 1);
    CHECK(st["kv_pages"]["moved_to_device"].get<int64_t>() >= 1);
    CHECK(st["bytes"]["kv_device"].get<uint64_t>() == st["kv_pages"]["on_device"].get<uint64_t>() * st["kv_pages"]["page_bytes"].get<uint64_t>());
    CHECK(st["bytes"]["kv_host"].is_number());
    CHECK(st["kv_pages"]["limit"].get<int>() == st["kv_blocks"]["total"].get<int>());
    const auto m2 = http_call(f.port, "GET", "/metrics").body;
    CHECK(m2.find("tandem_requests_total{model=\"stories\",route=\"completions\",outcome=\"length\"} 2") != std::string::npos);
    CHECK(m2.find("tandem_kv_pages_moved_total{model=\"stories\",direction=\"to_host\"}") != std::string::npos);
    CHECK(m2.find("tandem_kv_pages{model=\"stories\"}") != std::string::npos);
    CHECK(m2.find("tandem_kv_bytes{model=\"stories\",tier=\"device\"}") != std::string::npos);
    CHECK(m2.find("\ntandem_kv_usage_ratio ") != std::string::npos);
    check_clean(f);
  }
}
