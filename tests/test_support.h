// Helpers shared by the test suites: where test data lives, scratch files, running the CLI.
// The paths are compiled in (tests/CMakeLists.txt); the environment variables TANDEM_TEST_DATA,
// TANDEM_MODELS_DIR and TANDEM_BINARY, when set, replace them.
#pragma once

#include <filesystem>
#include <string>

namespace tandem::test {

// tests/data/<rel> ($TANDEM_TEST_DATA/<rel>)
std::filesystem::path data_path(const std::string& rel);
// .models/SmolLM2-135M-Instruct.Q4_1.gguf, or under $TANDEM_MODELS_DIR (may not exist).
std::filesystem::path smollm_path();
// Exits the test process with 77 (CTest "skipped") when the SmolLM2 model is absent, after
// printing why. Only call it from suites named "smollm*", which CTest runs on their own.
void require_smollm();

// A fresh directory under the system temp dir, removed when the object dies.
class scratch_dir {
 public:
  scratch_dir();
  ~scratch_dir();
  scratch_dir(const scratch_dir&) = delete;
  scratch_dir& operator=(const scratch_dir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::filesystem::path operator/(const std::string& name) const { return path_ / name; }

 private:
  std::filesystem::path path_;
};

struct command_result {
  int exit_code = -1;
  std::string out;  // stdout
  std::string err;  // stderr
};
// Runs the built tandem binary ($TANDEM_BINARY) with `args` (a shell-quoted argument string).
command_result run_tandem(const std::string& args);

std::string read_file(const std::filesystem::path& p);

}  // namespace tandem::test
