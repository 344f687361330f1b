// models/jinja: every real chat template in tests/data/templates rendered for every case of
// cases.json, byte for byte as transformers renders it with Python's jinja2
// (tests/data/templates/render.py wrote the expected files); the template's own
// raise_exception gives jinja::raised with its message, other failures jinja::error.
#include "models/jinja/template.h"

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

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
