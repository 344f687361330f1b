// A model whose GGUF carries its own Jinja chat template, served for real: POST /apply-template
// (llama.cpp's) shows the conversation as the template renders it, chat completions tokenize
// exactly that text (BOS not doubled when the template writes it), chat_template_kwargs reach
// the template, and a template that raises gives a 400 naming `messages`.
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "api/http_server.h"
#include "api/router.h"
#include "api/server_context.h"
#include "bench/http_client.h"
#include "configs/roster_loader.h"
#include "models/gguf_reader.h"
#include "models/gguf_writer.h"
#include "models/synth.h"
#include "models/tokenizer.h"
#include "runtime/served_roster.h"
#include "tests/test_support.h"

using nlohmann::json;
using tandem::bench::http_call;
using namespace tandem;

namespace {

// Its own template: roles in angle brackets, the BOS text first, a flag the request may set,
// and a refusal of a conversation that starts with the assistant.
constexpr const char* k_template =
    "{{ bos_token }}{% if messages[0].role == 'assistant' %}{{ raise_exception('the first message must not be the assistant\\'s') }}{% endif %}"
    "{% for m in messages %}<{{ m.role }}>{{ m.content | trim }}</{{ m.role }}>\n{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% if enable_thinking is defined and not enable_thinking %}(no thinking){% endif %}{% endif %}";

// A tiny model on stories260K's vocabulary whose tokenizer.chat_template is `tmpl`.
void write_model(const std::string& path, const std::string& tmpl, const std::string& dir) {
  const std::string vocab = dir + "/vocab.gguf";
  {
    const models::gguf_file stories(test::data_path("stories260K.gguf").string());
    models::gguf_writer w;
    for (const auto& kv : stories.metadata())
      if (kv.key.rfind("tokenizer.", 0) == 0) w.set(kv.key, models::gguf_out_value::from(kv.value));
    w.set("tokenizer.chat_template", models::gguf_out_value::string(tmpl));
    w.write(vocab);
  }
  models::synth_options o;
  o.dim = 32;
  o.layers = 1;
  o.heads = 2;
  o.kv_heads = 2;
  o.ffn = 64;
  o.context = 256;
  o.type = kernels::weight_type::q8_0;
  o.vocab_path = vocab;
  o.threads = 1;
  models::synth_model(o, path);
}

struct server {
  test::scratch_dir dir;
  configs::roster roster;
  std::unique_ptr<runtime::served_roster> served;
  std::unique_ptr<api::server_context> ctx;
  std::unique_ptr<api::http_server> http;
  explicit server(const std::string& tmpl) {
    const std::string path = (dir / "jinja.gguf").string();
    write_model(path, tmpl, dir.path().string());
    const std::string yaml =
        "server:\n  listen: 127.0.0.1:0\ndevices:\n  - backend: cpu\n    vram: 32MiB\n    host: 32MiB\nmodels:\n  - name: j\n    path: " + path +
        "\n    context: 256\n";
    roster = configs::parse_roster(yaml, "t.yaml", dir.path().string());
    served = std::make_unique<runtime::served_roster>(roster, runtime::serve_options{.threads = 1});
    ctx = std::make_unique<api::server_context>(*served, roster.server);
    auto hc = api::http_config_of(roster.server);
    hc.admit = api::make_admission(*ctx);
    http = std::make_unique<api::http_server>(hc, api::make_router(*ctx));
  }
  ~server() {
    http->stop();
    served->executor().drain();
  }
  uint16_t port() const { return http->port(); }
};

}  // namespace

TEST_SUITE("api") {
  TEST_CASE("the model's own Jinja template: /apply-template, chat completions on its text, kwargs, and a refusal") {
    server s(k_template);
    const json conv{{"model", "j"}, {"messages", {{{"role", "system"}, {"content", "Be brief. "}}, {{"role", "user"}, {"content", " Hi!"}}}}};
    auto r = http_call(s.port(), "POST", "/apply-template", conv.dump());
    REQUIRE(r.status == 200);
    const std::string prompt = json::parse(r.body)["prompt"];
    CHECK(prompt == "<s><system>Be brief.</system>\n<user>Hi!</user>\n<assistant>");

    // Chat completions see that text, BOS once (the template wrote it).
    json chat = conv;
    chat["max_tokens"] = 2;
    chat["temperature"] = 0;
    r = http_call(s.port(), "POST", "/v1/chat/completions", chat.dump());
    REQUIRE(r.status == 200);
    const auto tok = models::tokenizer::from_gguf(s.served->models()[0]->model->file());
    const auto ids = tok.encode(prompt, false, true);
    CHECK(json::parse(r.body)["usage"]["prompt_tokens"] == ids.size());
    CHECK(ids.front() == tok.bos());
    CHECK(ids[1] != tok.bos());

    // The template's own variables.
    json kw = conv;
    kw["chat_template_kwargs"] = {{"enable_thinking", false}};
    r = http_call(s.port(), "POST", "/apply-template", kw.dump());
    CHECK(json::parse(r.body)["prompt"].get<std::string>().ends_with("<assistant>(no thinking)"));
    kw["chat_template_kwargs"] = "yes";
    r = http_call(s.port(), "POST", "/v1/chat/completions", kw.dump());
    CHECK(r.status == 400);
    CHECK(json::parse(r.body)["error"]["param"] == "chat_template_kwargs");

    // raise_exception: a 400 naming messages, with the template's words.
    const json bad{{"model", "j"}, {"messages", {{{"role", "assistant"}, {"content", "Hello"}}}}};
    for (const char* route : {"/apply-template", "/v1/chat/completions", "/api/chat"}) {
      CAPTURE(route);
      r = http_call(s.port(), "POST", route, bad.dump());
      CHECK(r.status == 400);
      CHECK(r.body.find("the first message must not be the assistant's") != std::string::npos);
    }
    CHECK(json::parse(http_call(s.port(), "POST", "/v1/chat/completions", bad.dump()).body)["error"]["param"] == "messages");
  }

  TEST_CASE("a template that does not parse leaves the built-in format; one that loops without end is cut off with a 400") {
    {
      server s("{% for m in messages %}{{ m.content }");  // never closed
      const json conv{{"model", "j"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}};
      const auto r = http_call(s.port(), "POST", "/apply-template", conv.dump());
      REQUIRE(r.status == 200);
      CHECK(json::parse(r.body)["prompt"] == "User: Hi\nAssistant:");  // the plain family
    }
    server s("{% for i in range(1000000) %}{% for j in range(1000000) %}x{% endfor %}{% endfor %}");
    const json conv{{"model", "j"}, {"messages", {{{"role", "user"}, {"content", "Hi"}}}}};
    const auto r = http_call(s.port(), "POST", "/v1/chat/completions", conv.dump());
    CHECK(r.status == 400);
    CHECK(r.body.find("steps") != std::string::npos);
  }
}
