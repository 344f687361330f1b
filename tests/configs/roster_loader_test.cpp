#include "configs/roster_loader.h"

#include <doctest/doctest.h>
#include <yaml-cpp/yaml.h>

#include <fstream>
#include <sstream>
#include <string>

#include "tests/configs/json_schema_check.h"
#include "tests/test_support.h"

using namespace tandem;
using configs::config_error;

namespace {

std::string repo_file(const std::string& rel) { return (test::data_path("..") / ".." / rel).lexically_normal().string(); }

// A valid roster whose model files are stated, not present; each test breaks one thing.
const std::string k_base = R"(devices:
  - backend: cpu
    vram: 8GiB
    host: 16GiB
models:
  - name: chat
    aliases: [big]
    path: nowhere/chat.gguf
    priority: 10
    size: 4GiB
    kv_bytes_per_token: 128KiB
    context: 4096
    max_sequences: 2
  - name: code
    path: nowhere/code.gguf
    role: code
    priority: 50
    size: 1GiB
    kv_bytes_per_token: 32KiB
)";

configs::roster parse(const std::string& yaml, bool require_files = false) {
  return configs::parse_roster(yaml, "r.yaml", "", {.require_files = require_files});
}

// The message of the config_error `yaml` raises.
std::string error_of(const std::string& yaml, bool require_files = false) {
  try {
    parse(yaml, require_files);
  } catch (const config_error& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST_SUITE("roster_loader") {
  TEST_CASE("a valid roster: defaults, units, lookups by name and alias") {
    const auto r = parse(k_base);
    REQUIRE(r.models.size() == 2);
    CHECK(r.server.listen == "127.0.0.1:8080");
    CHECK(r.devices[0].vram == 8ull << 30);
    CHECK(r.devices[0].backend == configs::backend_choice::cpu);
    CHECK(r.models[0].kv_bytes_per_token == 128u << 10);
    CHECK(r.models[1].role == configs::model_role::code);
    CHECK(r.models[0].keep_alive.after == std::chrono::minutes(5));
    CHECK(r.find("big") == &r.models[0]);
    CHECK(r.find("code") == &r.models[1]);
    CHECK(r.find("nope") == nullptr);
    CHECK(configs::kv_budget_bytes(r.models[0]) == (128ull << 10) * 4096 * 2);
    CHECK(r.policy.name == "tandem");
    CHECK(r.policy.interleave);  // the default
    CHECK(r.policy.itl_target == std::chrono::milliseconds(50));
    CHECK(r.policy.itl_budget == 2.0);
    CHECK(r.models[0].kv_reserve == 0);
    CHECK_FALSE(r.models[0].kv_limit);
    const auto kv = parse(k_base + "    kv_reserve: 64MiB\n    kv_limit: 256MiB\n");
    CHECK(kv.models[1].kv_reserve == 64u << 20);
    CHECK(kv.models[1].kv_limit == 256u << 20);
    CHECK(configs::kv_budget_bytes(kv.models[1]) == 256u << 20);  // below context x max_sequences
    // The stated kv_bytes_per_token is the f16 figure; the entry carries its kv_type's size
    // (f32 twice it, q8_0 34 bytes per 32 values, q4_0 18 per 32 against f16's 64).
    CHECK_FALSE(r.models[1].kv_rotate);  // unset: the type's default (rotated for q4_0)
    for (const auto& [type, bytes] : {std::pair{"f32", 64u << 10}, std::pair{"q8_0", 17u << 10}, std::pair{"q4_0", 9u << 10}}) {
      CAPTURE(type);
      const auto q = parse(k_base + "    kv_type: " + type + "\n    kv_rotate: false\n");
      CHECK(q.models[1].kv_bytes_per_token == bytes);
      CHECK(q.models[1].kv_rotate == false);
      CHECK(configs::kv_budget_bytes(q.models[1]) == uint64_t(bytes) * 4096 * 4);  // the default context and sequences
    }
    CHECK(parse(k_base + "    kv_type: q4_0\n").models[1].kv_type == configs::kv_cache_type::q4_0);
    const auto t = parse(k_base + "policy:\n  itl_target: 120ms\n  itl_budget: 0\n");
    CHECK(t.policy.itl_target == std::chrono::milliseconds(120));
    CHECK(t.policy.itl_budget == 0);
  }

  TEST_CASE("every error names file, line, column and key") {
    struct bad {
      std::string yaml;
      std::string says;
    };
    auto edit = [](std::string s, const std::string& from, const std::string& to) {
      const auto at = s.find(from);
      REQUIRE(at != std::string::npos);
      return s.replace(at, from.size(), to);
    };
    auto with = [&](const std::string& from, const std::string& to) { return edit(k_base, from, to); };
    const std::vector<bad> cases = {
        {"devices: [\n  - vram: 1GiB\n models: x", "r.yaml:2:3: malformed YAML"},
        {with("    priority: 10\n", "    priority: 10\n    priorty: 3\n"), "r.yaml:10:5: models[0].priorty: unknown key (expected one of: name,"},
        {with("    priority: 10\n", "    priority: high\n"), "r.yaml:9:15: models[0].priority: expected an integer, got 'high'"},
        {with("    priority: 10\n", "    priority: 5000\n"), "models[0].priority: must be in [0, 1000], got 5000"},
        {with("    vram: 8GiB\n", "    vram: lots\n"), "r.yaml:3:11: devices[0].vram: expected a size such as 512MiB"},
        {with("    vram: 8GiB\n", ""), "r.yaml:2:5: devices[0]: missing key 'vram'"},
        {with("    aliases: [big]\n", "    aliases: [code]\n"), "r.yaml:14:11: models[1].name: 'code' is already used (line 6, aliases[0])"},
        {with("  - name: code\n", "  - name: chat\n"), "models[1].name: 'chat' is already used (line 6, name)"},
        {with("    context: 4096\n", "    context: 4096\n    draft: code\n"), "models[0].draft: 'code' has role code, expected draft"},
        {with("    context: 4096\n", "    context: 4096\n    draft: ghost\n"), "models[0].draft: no model named 'ghost' in the roster"},
        {with("    role: code\n", "    role: coder\n"), "models[1].role: expected one of chat, code, draft, medusa, got 'coder'"},
        {with("    context: 4096\n", "    context: 4096\n    speculate: {method: medusa}\n"),
         "r.yaml:13:25: models[0].speculate.method: expected one of off, ngram, draft, got 'medusa'"},
        {with("    context: 4096\n", "    context: 4096\n    speculate: {max_tokens: 64}\n"),
         "models[0].speculate.max_tokens: must be in [1, 32], got 64"},
        {with("    context: 4096\n", "    context: 4096\n    speculate: {max_tokens: many}\n"),
         "models[0].speculate.max_tokens: expected an integer"},
        {with("    context: 4096\n", "    context: 4096\n    speculate: {method: draft}\n"),
         "models[0].speculate.method: draft speculation needs a draft model attached ('draft: NAME')"},
        {with("    context: 4096\n", "    context: 4096\n    speculate: ngram\n"), "models[0].speculate: expected a mapping"},
        {with("    context: 4096\n", "    context: 4096\n    speculate: {method: ngram, cache: sometimes}\n"),
         "models[0].speculate.cache: expected true or false"},
        {with("    context: 4096\n", "    context: 4096\n    speculate: {cache: true}\n"),
         "models[0].speculate.cache: the n-gram cache is for method: ngram"},
        {with("    context: 4096\n", "    context: 4096\n    speculate: {method: ngram, depth: 3}\n"), "models[0].speculate.depth: unknown key"},
        {edit(with("    context: 4096\n", "    context: 4096\n    draft: code\n"), "    role: code\n", "    role: draft\n    size: 5GiB\n"),
         "models[0].draft: 'code' (5.0 GiB) is not smaller than 'chat' (4.0 GiB): a draft model must cost less to run than the model it serves"},
        {with("    size: 1GiB\n", ""), "models[1].path: model file 'nowhere/code.gguf' is not there, so the entry must state 'size'"},
        {edit(with("    priority: 10\n", "    priority: 10\n    pinned: true\n    keep_alive: -1\n    kv_reserve: 512MiB\n"), "    vram: 8GiB\n",
              "    vram: 5GiB\n") +
             "    pinned: true\n",
         "models[1].pinned: the pinned models (chat, code) need 5.5 GiB of weights and KV on the device, more than the device budget of 5.0 GiB"},
        {edit(with("    vram: 8GiB\n", "    vram: 3GiB\n"), "    priority: 10\n", "    priority: 10\n    preload: device\n"),
         "models[0].preload: the models pinned or preloaded to the device need"},
        {with("    context: 4096\n", "    context: 4096\n    kv_reserve: 9GiB\n"),
         "models[0].kv_reserve: a floor of 9.0 GiB of KV is more than the device budget of 8.0 GiB"},
        {with("    context: 4096\n", "    context: 4096\n    kv_limit: 1MiB\n"),
         "models[0].kv_limit: 1.0 MiB is less than one KV block (16 positions, 2.0 MiB)"},
        {with("    context: 4096\n", "    context: 4096\n    kv_limit: 32MiB\n    kv_reserve: 64MiB\n"),
         "models[0].kv_reserve: a floor of 64.0 MiB is above the model's kv_limit of 32.0 MiB"},
        {with("    context: 4096\n", "    context: 4096\n    kv_limit: plenty\n"), "models[0].kv_limit: expected a size"},
        {with("    context: 4096\n", "    context: 4096\n    kv_type: q3_k\n"),
         "r.yaml:13:14: models[0].kv_type: expected one of f16, f32, q8_0, q4_0, got 'q3_k'"},
        {with("    context: 4096\n", "    context: 4096\n    kv_rotate: maybe\n"), "r.yaml:13:16: models[0].kv_rotate: expected true or false"},
        {with("    context: 4096\n", "    context: 100000\n"), "models[0].context: one sequence of 100000 positions needs 12.2 GiB of KV cache"},
        {edit(with("    host: 16GiB\n", "    host: 1GiB\n"), "    priority: 10\n", "    priority: 10\n    preload: host\n"),
         "the models preloaded to the host need 4.0 GiB, more than the host budget of 1.0 GiB"},
        {k_base + "policy:\n  home: ghost\n", "policy.home: no model named 'ghost'"},
        {k_base + "policy:\n  name: fifo\n", "policy.name: expected one of tandem, exclusive, lru-keepalive, static"},
        {k_base + "policy:\n  interleave: sometimes\n", "policy.interleave"},
        {k_base + "policy:\n  itl_target: fast\n", "policy.itl_target: expected a duration"},
        {k_base + "policy:\n  itl_target: -5ms\n", "policy.itl_target: expected a duration"},
        {k_base + "policy:\n  itl_target: 1m\n", "policy.itl_target: expected a duration of at most 10s"},
        {k_base + "policy:\n  itl_budget: -1\n", "policy.itl_budget: expected a number in [0, 100]"},
        {k_base + "policy:\n  itl_budget: lots\n", "policy.itl_budget"},
        {k_base + "server:\n  listen: localhost\n", "server.listen: expected HOST:PORT"},
        {k_base + "server:\n  limits:\n    idle_timeout: forever\n", "server.limits.idle_timeout: expected a duration"},
        {k_base + "extra: 1\n", "extra: unknown key (expected one of: server, devices, models, policy)"},
        {"devices:\n  - vram: 1GiB\n", "missing key 'models'"},
        {"devices: []\nmodels: []\n", "devices: expected a non-empty list"},
    };
    for (const auto& c : cases) {
      CAPTURE(c.yaml);
      const auto got = error_of(c.yaml);
      CAPTURE(got);
      CHECK(got.find(c.says) != std::string::npos);
    }
  }

  TEST_CASE("speculate: method and max_tokens; a draft attachment defaults to draft speculation, off turns it off") {
    const auto r = parse(k_base + "    speculate: {method: ngram, max_tokens: 5}\n");
    CHECK(r.models[1].speculate.method == configs::speculate_method::ngram);
    CHECK(r.models[1].speculate.max_tokens == 5);
    CHECK_FALSE(r.models[1].speculate.cache);
    CHECK(parse(k_base + "    speculate: {method: ngram, cache: true}\n").models[1].speculate.cache);
    CHECK(r.models[0].speculate.method == configs::speculate_method::off);
    CHECK(r.models[0].speculate.max_tokens == 8);
    const std::string drafted = k_base + "  - name: d\n    path: nowhere/d.gguf\n    role: draft\n    size: 100MiB\n    kv_bytes_per_token: 8KiB\n";
    auto attach = [&](const std::string& extra) {
      std::string y = drafted;
      return y.replace(y.find("    max_sequences: 2\n"), 21, "    max_sequences: 2\n    draft: d\n" + extra);
    };
    CHECK(parse(attach("")).models[0].speculate.method == configs::speculate_method::draft);
    CHECK(parse(attach("    speculate: {method: off}\n")).models[0].speculate.method == configs::speculate_method::off);
    CHECK(parse(attach("    speculate: {max_tokens: 3}\n")).models[0].speculate.max_tokens == 3);
  }

  TEST_CASE("with files required, a missing model file is an error naming the resolved path") {
    const auto got = error_of(k_base, true);
    CHECK(got.find("r.yaml:8:11: models[0].path: model file 'nowhere/chat.gguf' not found") != std::string::npos);
  }

  TEST_CASE("the demo and office rosters load; the JSON Schema validates both") {
    const auto demo = configs::load_roster(repo_file("configs/demo.yaml"));
    // SmolLM2 is optional: served when setup fetched it, else left out with a note.
    REQUIRE(demo.models.size() + demo.skipped.size() == 3);
    CHECK((demo.skipped.empty() ? demo.find("chat") != nullptr : demo.skipped[0].rfind("smollm", 0) == 0));
    REQUIRE(demo.find("stories"));
    CHECK(demo.find("stories")->size_bytes > 0u);  // from the file
    CHECK(demo.find("stories-q8")->priority > demo.find("stories")->priority);
    CHECK(demo.policy.home == "stories");
    const auto office = configs::load_roster(repo_file("configs/office-24gb.yaml"), {.require_files = false});
    REQUIRE(office.models.size() == 3);
    CHECK(office.find("gpt-4o") == &office.models[0]);
    CHECK(office.models[0].draft == "chat-draft");
    CHECK(office.models[0].speculate.method == configs::speculate_method::draft);  // attached: draft by default
    CHECK(office.models[1].speculate.method == configs::speculate_method::off);
    CHECK(office.models[1].keep_alive.forever);
    CHECK_THROWS_AS(configs::load_roster(repo_file("configs/office-24gb.yaml")), config_error);  // files absent

    std::ifstream in(repo_file("configs/roster.schema.json"));
    const test::json_schema_check schema(nlohmann::json::parse(in));
    for (const char* f : {"configs/demo.yaml", "configs/office-24gb.yaml"}) {
      CAPTURE(f);
      const auto errors = schema.errors(test::yaml_to_json(YAML::LoadFile(repo_file(f))));
      CHECK(errors.empty());
      for (const auto& e : errors) MESSAGE(e);
    }
    // The schema does reject what the loader rejects (a sample).
    CHECK_FALSE(schema.errors(test::yaml_to_json(YAML::Load(k_base + "extra: 1\n"))).empty());
    CHECK_FALSE(schema.errors(test::yaml_to_json(YAML::Load("devices: [{vram: lots}]\nmodels: [{name: a, path: b}]\n"))).empty());
    CHECK(schema.errors(test::yaml_to_json(YAML::Load(k_base))).empty());
    CHECK(schema.errors(test::yaml_to_json(YAML::Load(k_base + "    kv_reserve: 64MiB\n    kv_limit: 1GiB\n"))).empty());
    CHECK_FALSE(schema.errors(test::yaml_to_json(YAML::Load(k_base + "    kv_limit: plenty\n"))).empty());
    CHECK(schema.errors(test::yaml_to_json(YAML::Load(k_base + "policy:\n  itl_target: 50ms\n  itl_budget: 2\n"))).empty());
    CHECK_FALSE(schema.errors(test::yaml_to_json(YAML::Load(k_base + "policy:\n  itl_budget: -1\n"))).empty());
    CHECK(schema.errors(test::yaml_to_json(YAML::Load(k_base + "    speculate: {method: ngram, max_tokens: 6}\n"))).empty());
    CHECK_FALSE(schema.errors(test::yaml_to_json(YAML::Load(k_base + "    speculate: {method: lookahead}\n"))).empty());
  }

  TEST_CASE("an optional model without its file is left out with a note; a required one is an error") {
    test::scratch_dir dir;
    const auto real = test::data_path("stories260K.gguf").string();
    const std::string yaml = "devices:\n  - name: d\n    vram: 64MiB\nmodels:\n  - name: here\n    path: " + real +
                             "\n  - name: gone\n    path: nowhere.gguf\n    optional: true\n";
    const auto r = configs::parse_roster(yaml, "r.yaml", dir.path().string());
    REQUIRE(r.models.size() == 1);
    CHECK(r.models[0].name == "here");
    REQUIRE(r.skipped.size() == 1);
    CHECK(r.skipped[0].find("gone") == 0);
    CHECK(r.find("gone") == nullptr);
    // Without require_files (sim, serve --check) it stays when it states its sizes.
    CHECK(configs::parse_roster(yaml, "r.yaml", dir.path().string(), {.require_files = false}).models.size() == 1);
    const auto sized =
        configs::parse_roster(yaml + "    size: 1GiB\n    kv_bytes_per_token: 1KiB\n", "r.yaml", dir.path().string(), {.require_files = false});
    CHECK(sized.models.size() == 2);
    const std::string only_gone = "devices:\n  - name: d\n    vram: 64MiB\nmodels:\n  - name: gone\n    path: nowhere.gguf\n    optional: true\n";
    CHECK_THROWS_WITH_AS(configs::parse_roster(only_gone, "r.yaml", dir.path().string()), doctest::Contains("none of their files"), config_error);
  }
}
