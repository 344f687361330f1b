// Subcommands register themselves here; main() builds the CLI11 app from the registry.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

namespace tandem::cli {

// `add` creates the subcommand on the root app and installs its callback. The callback
// reports failure by throwing; main() prints the message and exits with status 1.
struct command_entry {
  std::string name;
  std::function<void(CLI::App& root)> add;
};

std::vector<command_entry>& command_registry();

// Used at namespace scope in each cmd_<name>.cpp:
//   static const tandem::cli::command_registrar reg{"run", &add_run_command};
struct command_registrar {
  command_registrar(std::string name, std::function<void(CLI::App&)> add) { command_registry().push_back({std::move(name), std::move(add)}); }
};

// Exit status a command callback may request through this exception (e.g. 2 for usage).
struct exit_request {
  int code;
};

}  // namespace tandem::cli
