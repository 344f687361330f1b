// tandem: one executable, subcommands registered by the cmd_*.cpp files.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <exception>

#include "cli/command_registry.h"

namespace tandem::cli {
std::vector<command_entry>& command_registry() {
  static std::vector<command_entry> entries;
  return entries;
}
}  // namespace tandem::cli

int main(int argc, char** argv) {
  using namespace tandem::cli;
  // Logs go to stderr: stdout carries only what the command produces (generated text, JSON).
  spdlog::set_default_logger(spdlog::stderr_color_mt("tandem"));
  spdlog::set_pattern("[%H:%M:%S.%e] [%^%l%$] %v");
  spdlog::set_level(spdlog::level::warn);

  CLI::App app{"tandem: a multi-model resident LLM runtime"};
  app.require_subcommand(1);
  app.set_version_flag("--version", "tandem 0.1.0");
  bool verbose = false;
  app.add_flag("-v,--verbose", verbose, "log at info level")->each([](const std::string&) { spdlog::set_level(spdlog::level::info); });
  auto& reg = command_registry();
  std::sort(reg.begin(), reg.end(), [](const auto& a, const auto& b) { return a.name < b.name; });
  for (const auto& c : reg) c.add(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const exit_request& r) {
    return r.code;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem: error: %s\n", e.what());
    return 1;
  }
  return 0;
}
