// `tandem serve` end to end: the real binary serves the demo roster on an ephemeral port,
// answers, and shuts down gracefully on SIGTERM; `--check` and a broken roster.
#include <doctest/doctest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>

#include "bench/http_client.h"
#include "tests/test_support.h"

using namespace tandem;
using namespace std::chrono_literals;

namespace {

// The binary started with its stdout on a pipe; killed (if still running) by the destructor.
struct child {
  pid_t pid = -1;
  int out = -1;
  std::string text;
  explicit child(const std::vector<std::string>& args) {
    int p[2];
    REQUIRE(pipe(p) == 0);
    pid = fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      dup2(p[1], 1);
      close(p[0]);
      std::vector<char*> argv;
      static std::string bin = TANDEM_BINARY;
      argv.push_back(bin.data());
      for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
      argv.push_back(nullptr);
      execv(bin.c_str(), argv.data());
      _exit(127);
    }
    close(p[1]);
    out = p[0];
  }
  ~child() {
    if (pid > 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
    }
    if (out >= 0) close(out);
  }
  // Reads stdout until `needle` shows up (or EOF).
  bool wait_for(const std::string& needle) {
    char buf[4096];
    while (text.find(needle) == std::string::npos) {
      const ssize_t n = read(out, buf, sizeof buf);
      if (n <= 0) return false;
      text.append(buf, static_cast<size_t>(n));
    }
    return true;
  }
  int stop(int sig) {
    kill(pid, sig);
    int status = 0;
    waitpid(pid, &status, 0);
    pid = -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
};

}  // namespace

TEST_SUITE("serve") {
  TEST_CASE("the demo roster on an ephemeral port: health, a chat completion, then SIGTERM stops it cleanly") {
    const std::string roster = (std::filesystem::path(TANDEM_TEST_DATA) / "../../configs/demo.yaml").string();
    child c({"serve", "-c", roster, "--listen", "127.0.0.1:0", "--threads", "2"});
    REQUIRE(c.wait_for("listening on http://127.0.0.1:"));
    REQUIRE(c.wait_for("\n"));
    const auto at = c.text.find("listening on http://127.0.0.1:") + std::string("listening on http://127.0.0.1:").size();
    const auto port = static_cast<uint16_t>(std::stoi(c.text.substr(at)));
    CHECK(c.text.find("model stories") != std::string::npos);
    bool healthy = false;
    for (int i = 0; i < 500 && !healthy; ++i) {
      healthy = bench::http_call(port, "GET", "/health").status == 200;
      if (!healthy) std::this_thread::sleep_for(10ms);
    }
    CHECK(healthy);
    const auto r = bench::http_call(port, "POST", "/v1/chat/completions",
                                    R"({"model":"default","messages":[{"role":"user","content":"Tell me a story"}],"max_tokens":8})");
    CHECK(r.status == 200);
    CHECK(nlohmann::json::parse(r.body)["choices"][0]["message"]["content"].is_string());
    CHECK(c.stop(SIGTERM) == 0);
  }

  TEST_CASE("--check validates a roster with serve's placement checks; a broken roster is a clear error") {
    const std::string roster = (std::filesystem::path(TANDEM_TEST_DATA) / "../../configs/demo.yaml").string();
    const auto ok = test::run_tandem("serve --check -c '" + roster + "'");
    CHECK(ok.exit_code == 0);
    CHECK(ok.out.find("roster OK") != std::string::npos);
    test::scratch_dir dir;
    std::ofstream(dir / "bad.yaml") << "devices:\n  - name: d\n    vram: lots\nmodels: []\n";
    const auto bad = test::run_tandem("serve -c '" + (dir / "bad.yaml").string() + "'");
    CHECK(bad.exit_code == 1);
    CHECK(bad.err.find("vram") != std::string::npos);
    CHECK(ok.out.find("kv stories (f16): pages of 10.0 KiB") != std::string::npos);  // KV limits and floors, in pages
    CHECK(ok.out.find("beside its weights (") != std::string::npos);
    // What serve refuses after opening the model, --check refuses with the same message.
    std::ofstream(dir / "floor.yaml") << "devices:\n  - backend: cpu\n    vram: 1MiB\n    host: 8MiB\nmodels:\n  - name: tiny\n    path: "
                                      << test::data_path("stories260K.gguf").string() << "\n    kv_reserve: 900KiB\n    context: 512\n";
    const auto checked = test::run_tandem("serve --check -c '" + (dir / "floor.yaml").string() + "'");
    const auto served = test::run_tandem("serve -c '" + (dir / "floor.yaml").string() + "'");
    CHECK(checked.exit_code == 1);
    CHECK(served.exit_code == 1);
    const std::string says = "model 'tiny' (line 6) cannot run on a device budget of 1.0 MiB";
    CHECK(checked.err.find(says) != std::string::npos);
    CHECK(served.err.find(says) != std::string::npos);
  }
}
