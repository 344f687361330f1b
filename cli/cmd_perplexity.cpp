// `tandem perplexity`: the perplexity of a text file under a model, as llama.cpp's
// `llama-perplexity` reports it (runtime/perplexity.h), for one KV cache type, so the quality
// cost of each type is a measured figure.
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <thread>

#include "cli/command_registry.h"
#include "cli/kv_options.h"
#include "cli/log.h"
#include "kernels/cpu/thread_pool.h"
#include "models/model.h"
#include "models/tokenizer.h"
#include "runtime/perplexity.h"

namespace tandem::cli {
namespace {

struct perplexity_args {
  std::string model;
  std::string file;
  int64_t n_ctx = 512;
  int64_t chunks = -1;
  int threads = 0;
  cli::kv_options kv;
  bool json = false;
};

void run_perplexity(const perplexity_args& a) {
  std::ifstream in(a.file, std::ios::binary);
  if (!in) throw std::runtime_error("perplexity: cannot read " + a.file);
  std::ostringstream text;
  text << in.rdbuf();
  const models::model m(a.model);
  const auto tok = models::tokenizer::from_gguf(m.file());
  models::check_tokenizer_matches(tok, m.config(), a.model);
  const auto ids = tok.encode(text.str(), tok.add_bos(), false);
  const int threads = a.threads > 0 ? a.threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  kernels::cpu::thread_pool pool(threads);
  runtime::perplexity_params p;
  p.n_ctx = a.n_ctx;
  p.max_chunks = a.chunks;
  p.kv = cli::kv_type_of(a.kv);
  p.kv_rotate = cli::kv_rotate_of(a.kv);
  const auto t0 = std::chrono::steady_clock::now();
  const auto r = runtime::perplexity(m, ids, tok.bos(), p, &pool, [&](int64_t c, double ppl) {
    if (!a.json) std::fprintf(stderr, "[%lld]%.4f,", static_cast<long long>(c + 1), ppl);
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (a.json) {
    const nlohmann::json j{{"model", a.model}, {"file", a.file},           {"kv_type", a.kv.type},   {"kv_rotate", p.kv_rotate},
                           {"n_ctx", a.n_ctx}, {"tokens", ids.size()},     {"chunks", r.chunks},     {"scored", r.scored},
                           {"ppl", r.ppl},     {"ppl_error", r.ppl_error}, {"mean_nll", r.mean_nll}, {"running", r.running},
                           {"seconds", secs}};
    std::puts(j.dump().c_str());
    return;
  }
  std::fprintf(stderr, "\n");
  std::printf("%s: %lld tokens, %lld chunks of %lld, KV %s%s: PPL = %.4f +/- %.4f (%lld tokens scored, %.1f s)\n", a.file.c_str(),
              static_cast<long long>(ids.size()), static_cast<long long>(r.chunks), static_cast<long long>(a.n_ctx), a.kv.type.c_str(),
              p.kv_rotate ? " rotated" : "", r.ppl, r.ppl_error, static_cast<long long>(r.scored), secs);
}

void add_perplexity_command(CLI::App& root) {
  auto a = std::make_shared<perplexity_args>();
  auto* cmd = root.add_subcommand("perplexity", "Perplexity of a text file under a model (as llama-perplexity)");
  cmd->add_option("-m,--model", a->model, "GGUF model file")->required()->check(CLI::ExistingFile);
  cmd->add_option("-f,--file", a->file, "text file")->required()->check(CLI::ExistingFile);
  cmd->add_option("-c,--ctx", a->n_ctx, "tokens per chunk; the second half of each is scored")
      ->check(CLI::Range(int64_t{2}, int64_t{1} << 20))
      ->capture_default_str();
  cmd->add_option("--chunks", a->chunks, "most chunks to score (-1: all)")->check(CLI::Range(int64_t{-1}, int64_t{1} << 30))->capture_default_str();
  cmd->add_option("-t,--threads", a->threads, "threads (0: all cores)")->check(CLI::Range(0, 1024));
  cli::add_kv_options(cmd, a->kv);
  cmd->add_flag("--json", a->json, "one JSON object: ppl, ppl_error, mean_nll, chunks, scored, running, seconds");
  cmd->callback([a] { run_perplexity(*a); });
}

const command_registrar reg{"perplexity", &add_perplexity_command};

}  // namespace
}  // namespace tandem::cli
