#include "tests/test_support.h"

#include <sys/wait.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <random>
#include <sstream>
#include <unistd.h>

namespace tandem::test {

namespace {

// The environment variable `name` when set and not empty, else the path compiled in: test
// executables packed by scripts/gpu-check --pack run where the build tree does not exist.
std::string configured_path(const char* name, const char* built_in) {
  const char* v = std::getenv(name);
  return v && *v ? v : built_in;
}

}  // namespace

std::filesystem::path data_path(const std::string& rel) { return std::filesystem::path(configured_path("TANDEM_TEST_DATA", TANDEM_TEST_DATA)) / rel; }

std::filesystem::path smollm_path() {
  return std::filesystem::path(configured_path("TANDEM_MODELS_DIR", TANDEM_MODELS_DIR)) / "SmolLM2-135M-Instruct.Q4_1.gguf";
}

void require_smollm() {
  if (std::filesystem::exists(smollm_path())) return;
  std::cerr << "SKIPPED: " << smollm_path() << " is missing (scripts/setup fetches it from PyPI)\n";
  std::exit(77);
}

scratch_dir::scratch_dir() {
  static std::atomic<int> counter{0};
  path_ = std::filesystem::temp_directory_path() / ("tandem-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++));
  std::filesystem::create_directories(path_);
}

scratch_dir::~scratch_dir() {
  std::error_code ec;
  std::filesystem::remove_all(path_, ec);
}

std::string read_file(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

command_result run_tandem(const std::string& args) {
  scratch_dir dir;
  const auto out = dir / "stdout";
  const auto err = dir / "stderr";
  const std::string bin = configured_path("TANDEM_BINARY", TANDEM_BINARY);
  const std::string cmd = "'" + bin + "' " + args + " >'" + out.string() + "' 2>'" + err.string() + "' </dev/null";
  const int status = std::system(cmd.c_str());
  command_result r;
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r.out = read_file(out);
  r.err = read_file(err);
  return r;
}

}  // namespace tandem::test
