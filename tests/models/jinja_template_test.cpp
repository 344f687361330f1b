// models/jinja: every real chat template in tests/data/templates rendered for every case of
// cases.json, byte for byte as transformers renders it with Python's jinja2
// (tests/data/templates/render.py wrote the expected files); the template's own
// raise_exception gives jinja::raised with its message, other failures jinja::error.
#include "models/jinja/template.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "tests/test_support.h"

using namespace tandem;
using models::jinja::value;

namespace {

std::string slurp(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

models::jinja::render_options fixed_clock() {
  models::jinja::render_options o;
  std::tm tm{};
  tm.tm_year = 2024 - 1900;
  tm.tm_mon = 6;
  tm.tm_mday = 26;
  tm.tm_hour = 12;
  tm.tm_wday = 5;  // a Friday
  tm.tm_yday = 207;
  o.now = tm;
  return o;
}

std::string render(const std::string& source, const nlohmann::ordered_json& ctx = nlohmann::ordered_json::object()) {
  return models::jinja::program(source).render(value::from_json(ctx), fixed_clock());
}

}  // namespace

TEST_SUITE("jinja") {
  TEST_CASE("the real templates of 26 models render as Python's jinja2 does, for every case") {
    const auto dir = test::data_path("templates");
    const auto spec = nlohmann::ordered_json::parse(slurp(dir / "cases.json"));
    int rendered = 0, refused = 0;
    for (const auto& entry : std::filesystem::directory_iterator(dir)) {
      if (entry.path().extension() != ".jinja") continue;
      const std::string stem = entry.path().stem().string();
      CAPTURE(stem);
      const models::jinja::program prog(slurp(entry.path()));
      for (const auto& [name, c] : spec["cases"].items()) {
        CAPTURE(name);
        auto ctx = c;
        ctx.erase("with_tools");
        ctx["bos_token"] = "<s>";
        ctx["eos_token"] = "</s>";
        if (c.value("with_tools", false)) ctx["tools"] = spec["tools"];
        const auto out = dir / (stem + "." + name + ".out");
        const auto err = dir / (stem + "." + name + ".err");
        if (std::filesystem::exists(out)) {
          std::string got;
          CHECK_NOTHROW(got = prog.render(value::from_json(ctx), fixed_clock()));
          CHECK(got == slurp(out));
          ++rendered;
        } else {
          REQUIRE(std::filesystem::exists(err));
          const std::string want = slurp(err);
          try {
            (void)prog.render(value::from_json(ctx), fixed_clock());
            FAIL("rendered where jinja2 failed: " << want);
          } catch (const models::jinja::raised& e) {
            CHECK(want == "raise: " + e.message);
          } catch (const models::jinja::error& e) {
            CHECK_MESSAGE(want.rfind("error: ", 0) == 0, e.what());
          }
          ++refused;
        }
      }
    }
    CHECK(rendered + refused == 26 * 4);
    CHECK(rendered >= 90);
  }
}

TEST_SUITE("jinja") {
  TEST_CASE("one construct at a time: output, errors and whitespace as Python's jinja2 gives them") {
    const auto dir = test::data_path("templates");
    const auto snippets = nlohmann::ordered_json::parse(slurp(dir / "snippets.json"));
    const auto expected = nlohmann::ordered_json::parse(slurp(dir / "snippets.expected.json"));
    REQUIRE(snippets.size() == expected.size());
    for (size_t i = 0; i < snippets.size(); ++i) {
      const std::string t = snippets[i]["t"];
      CAPTURE(t);
      const auto& want = expected[i];
      const auto ctx = snippets[i].value("c", nlohmann::ordered_json::object());
      if (want.contains("out")) {
        std::string got;
        CHECK_NOTHROW(got = render(t, ctx));
        CHECK(got == want["out"].get<std::string>());
      } else if (want.contains("raise")) {
        CHECK_THROWS_WITH_AS(render(t, ctx), doctest::Contains(want["raise"].get<std::string>().c_str()), models::jinja::raised);
      } else {
        CHECK_THROWS_AS(render(t, ctx), models::jinja::error);
      }
    }
  }
}

TEST_SUITE("jinja") {
  TEST_CASE("hostile templates: endless loops and recursion, deep nesting and long tags end in an error, not a hang or a crash") {
    using models::jinja::error;
    // A loop of 10^12 iterations stops at the step limit.
    CHECK_THROWS_WITH_AS(render("{% for i in range(1000000) %}{% for j in range(1000000) %}x{% endfor %}{% endfor %}"), doctest::Contains("steps"),
                         error);
    // Unbounded recursion stops at the depth limit.
    CHECK_THROWS_WITH_AS(render("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"), doctest::Contains("nests more than"), error);
    // Brackets and blocks nested beyond the parser's bound.
    CHECK_THROWS_WITH_AS(render("{{ " + std::string(1000, '(') + "1" + std::string(1000, ')') + " }}"), doctest::Contains("nest more than"), error);
    CHECK_THROWS_WITH_AS(render("{{ " + std::string(3000, '-') + "1 }}"), doctest::Contains("nest more than"), error);
    std::string blocks;
    for (int i = 0; i < 300; ++i) blocks += "{% if true %}";
    CHECK_THROWS_AS(render(blocks), error);
    // A chain of operators longer than one tag may be.
    std::string chain = "{{ 1";
    for (int i = 0; i < 5000; ++i) chain += " + 1";
    CHECK_THROWS_WITH_AS(render(chain + " }}"), doctest::Contains("tokens"), error);
    // A namespace that holds itself cannot be printed forever.
    CHECK_THROWS_WITH_AS(render("{% set ns = namespace(a=1) %}{% set ns.self = ns %}{{ ns }}"), doctest::Contains("nests more than"), error);
    // A value doubling in each step of a loop is bounded by the step limit too, and a huge
    // repetition is refused at once.
    CHECK_THROWS_AS(render("{{ 'x' * 100000000 }}"), error);
    // Errors name the line.
    CHECK_THROWS_WITH_AS(render("line one\n{{ x.y }}"), doctest::Contains("line 2"), error);
    CHECK_THROWS_WITH_AS(render("a\nb\n{% if %}"), doctest::Contains("line 3"), error);
  }

  TEST_CASE("the context: JSON in, values out; unknown names are Undefined, printing as nothing") {
    nlohmann::ordered_json ctx = {{"messages", {{{"role", "user"}, {"content", "hi"}}}}, {"add_generation_prompt", true}, {"n", 3.5}};
    CHECK(render("{{ messages[0].content }}{{ add_generation_prompt }}{{ n }}{{ missing }}", ctx) == "hiTrue3.5");
    CHECK(render("{{ messages|tojson }}", ctx) == "[{\"role\": \"user\", \"content\": \"hi\"}]");
  }
}

TEST_SUITE("jinja") {
  TEST_CASE("mutated real templates parse and render or fail cleanly") {
    // Bytes flipped, cut and repeated in the real templates: every outcome is text or a
    // jinja::error (the sanitizer build checks that nothing reads out of bounds on the way).
    const auto dir = test::data_path("templates");
    std::vector<std::string> sources;
    for (const auto& entry : std::filesystem::directory_iterator(dir))
      if (entry.path().extension() == ".jinja") sources.push_back(slurp(entry.path()));
    std::sort(sources.begin(), sources.end());
    const nlohmann::ordered_json ctx = {{"messages", {{{"role", "user"}, {"content", "hi"}}, {{"role", "assistant"}, {"content", "yo"}}}},
                                        {"add_generation_prompt", true}};
    const auto context = value::from_json(ctx);
    uint64_t state = 12345;
    auto next = [&] {
      state = state * 6364136223846793005ull + 1442695040888963407ull;
      return state >> 33;
    };
    const char alphabet[] = "{}%#-+()[]'\"|.,: \n=~*/abcxyz0123456789";
    int rendered = 0;
    models::jinja::render_options o = fixed_clock();
    o.max_steps = 200000;
    for (int i = 0; i < 600; ++i) {
      std::string s = sources[next() % sources.size()];
      const int edits = 1 + static_cast<int>(next() % 4);
      for (int k = 0; k < edits && !s.empty(); ++k) {
        const size_t at = next() % s.size();
        switch (next() % 3) {
          case 0:
            s[at] = alphabet[next() % (sizeof alphabet - 1)];
            break;
          case 1:
            s.erase(at, std::min<size_t>(s.size() - at, next() % 16));
            break;
          default:
            s.insert(at, s.substr(at, std::min<size_t>(s.size() - at, next() % 16)));
        }
      }
      try {
        (void)models::jinja::program(s).render(context, o);
        ++rendered;
      } catch (const models::jinja::error&) {
      }
    }
    CHECK(rendered > 0);
  }
}
