// `tandem run`: generate text from a GGUF model on the CPU (or a CUDA device with --gpu), one request
// through a one-model engine (two with --draft: the draft proposes, the target verifies). Only the generated text goes to stdout; one line of timings
// to stderr.
#include <spdlog/spdlog.h>

#include <chrono>
#include <filesystem>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <random>
#include <algorithm>
#include <fstream>
#include <iterator>

#include "cli/log.h"
#include "cli/command_registry.h"
#include "cli/kv_options.h"
#include "kernels/cpu/isa.h"
#include "kernels/cpu/thread_pool.h"
#include "kernels/device_probe.h"
#include "configs/byte_size.h"
#include "models/chat_template.h"
#include "models/forward.h"
#include "models/model.h"
#include "models/tokenizer.h"
#include "models/weight_plan.h"
#include "runtime/draft_mirror.h"
#include "runtime/engine.h"
#include "runtime/grammar.h"
#include "runtime/json_schema.h"
#include "runtime/placement.h"

namespace tandem::cli {
namespace {

struct run_args {
  std::string model;
  std::string prompt;
  std::string chat;
  std::string system;
  std::string chat_template;
  bool default_system = false;
  int64_t n_predict = 128;
  int64_t n_ctx = 0;
  int threads = 0;
  cli::kv_options kv;
  bool has_seed = false;
  uint64_t seed = 0;
  runtime::sampling_params sampling;
  // Memory arbiter: with --vram the weights and KV live in a budgeted device tier.
  std::optional<uint64_t> vram, host_ram;
  double link_gbps = 0;
  bool no_stream = false;
  int prefetch_depth = 2;
  bool gpu = false;  // the CUDA forward pass, weights resident in VRAM
  // Speculative decoding: a draft model's guesses (--draft) or n-gram lookup (--draft-ngram),
  // at most draft_max verified per pass.
  std::string draft;
  std::string grammar_file, schema_file;  // constrained output (docs/structured-output.md)
  bool draft_ngram = false;
  int64_t draft_max = 8;
  bool draft_max_given = false;
};

// A CLI11 validator for byte sizes ("22GiB", "512MiB", "4096").
CLI::Validator byte_size_validator() {
  return CLI::Validator(
      [](std::string& s) -> std::string {
        return configs::parse_byte_size(s) ? std::string{} : "expected a size such as 512MiB, 8GiB or 4096 (bytes), got '" + s + "'";
      },
      "SIZE");
}

// The prompt token ids for a plain prompt or a chat message rendered with the model's template.
std::vector<int32_t> build_prompt(const run_args& a, const models::model& m, const models::tokenizer& tok) {
  if (a.chat.empty()) return tok.encode(a.prompt, tok.add_bos(), /*parse_special=*/true);
  // The model's own template family, unless one is named on the command line. Like llama.cpp's
  // built-in templates (llama-cli, llama_chat_apply_template), the default system prompt a
  // Jinja template would inject is left out unless asked for: SmolLM2's ("You are a helpful
  // AI assistant named SmolLM…") makes the 135M model answer factual questions in French
  // verse, while without it the same model answers them plainly.
  auto tmpl = models::chat_template_from_jinja(m.file().get_string("tokenizer.chat_template").value_or(""));
  if (!a.chat_template.empty()) {
    const auto k = models::parse_chat_template_name(a.chat_template);
    if (!k) throw std::runtime_error("unknown chat template '" + a.chat_template + "'");
    if (*k != tmpl.kind) tmpl = {*k, std::string(models::family_default_system_prompt(*k)), nullptr};
  }
  if (!a.default_system) tmpl.default_system.clear();
  cli::logger().info("chat template: {}{}", models::chat_template_name(tmpl.kind),
                     tmpl.default_system.empty() ? "" : " (with the template's default system prompt)");
  std::vector<models::chat_message> msgs;
  if (!a.system.empty()) msgs.push_back({"system", a.system});
  msgs.push_back({"user", a.chat});
  const std::string text = models::apply_chat_template(tmpl, msgs, /*add_generation_prompt=*/true);
  return tok.encode(text, tok.add_bos() && !models::renders_bos(tmpl.kind), /*parse_special=*/true);
}

// Puts one model of the run under the arbiter (--vram, --gpu) and points its engine entry at it.
std::unique_ptr<runtime::placed_model> place_for_run(const run_args& a, const models::model& m, const std::string& name, int64_t n_ctx,
                                                     uint64_t device_bytes, int64_t pass_rows, runtime::engine_model& em) {
  runtime::placement_options po;
  po.backend.kind = a.gpu ? memory::backend_kind::cuda : memory::backend_kind::cpu;
  po.backend.link_gbps = a.link_gbps;
  po.device_bytes = device_bytes;
  po.host_bytes = a.host_ram.value_or((m.plan().total_bytes() + (64 << 20)));
  po.allow_streaming = !a.no_stream;
  po.prefetch_depth = a.prefetch_depth;
  po.n_ctx = n_ctx;
  po.kv = em.kv;
  po.kv_rotate = em.kv_rotate;
  po.max_batch = pass_rows;
  po.wait = a.gpu;
  auto placed = runtime::place_model(m, name, po);
  const auto info = placed->backend->info();
  cli::logger().info("{}: backend {}{}", name, info.name,
                     info.link_gbps > 0 ? fmt::format(", host<->device link {:.1f} GB/s (simulated)", info.link_gbps) : std::string());
  cli::logger().info("{}: device {} / host {}: {} of {} segments on the device, {} staged on the host{}", name,
                     configs::format_byte_size(po.device_bytes), configs::format_byte_size(po.host_bytes), placed->on_device, placed->segments,
                     placed->staged,
                     placed->stream_slots > 0
                         ? fmt::format(", the rest streamed through {} stream slot{}", placed->stream_slots, placed->stream_slots == 1 ? "" : "s")
                         : std::string());
  em.residency = placed->residency.get();
  em.kv_pool = placed->kv.get();
  if (a.gpu) em.placement = placed->residency.get();  // its arbiter's backend picks the CUDA forward pass
  if (placed->scratch) em.scratch = placed->scratch->data;
  return placed;
}

// Device memory a draft needs to sit wholly on the device beside its target: its weights,
// its KV cache and its activations, with a margin for what a GPU pass takes besides.
uint64_t draft_device_bytes(const models::model& d, int64_t n_ctx, const runtime::engine_model& em, int64_t pass_rows) {
  models::context_params cp;
  cp.n_ctx = n_ctx;
  cp.kv = em.kv;
  cp.kv_rotate = em.kv_rotate;
  cp.max_batch = pass_rows;
  constexpr int64_t bt = 16;  // placement_options::kv_block_tokens
  const uint64_t kv = models::kv_bytes_per_token(d.config(), em.kv) * static_cast<uint64_t>((n_ctx + bt - 1) / bt * bt);
  return d.plan().total_bytes() + kv + models::forward_context::scratch_bytes(d.config(), cp) + (64ull << 20);
}

void run(const run_args& a) {
  if (a.prompt.empty() == a.chat.empty()) throw std::runtime_error("give exactly one of -p/--prompt and --chat");
  if (!a.vram && (a.host_ram || a.link_gbps > 0 || a.no_stream || a.prefetch_depth != 2))
    throw std::runtime_error("--host-ram, --link-gbps, --no-stream and --prefetch-depth need --vram");
  if (a.gpu && a.vram) throw std::runtime_error("--gpu and --vram cannot be combined (--vram budgets the CPU backend's simulated device)");
  if (!a.draft.empty() && a.draft_ngram) throw std::runtime_error("--draft and --draft-ngram cannot be combined: give one proposer");
  if (a.draft_max_given && a.draft.empty() && !a.draft_ngram) throw std::runtime_error("--draft-max needs --draft FILE or --draft-ngram");
  // Without --gpu, `run` computes on the CPU backend (with --vram too: its kernels read the
  // device tier directly); say once whether a GPU was there to be asked for.
  const auto cuda = kernels::probe_cuda();
  if (a.gpu && cuda.devices.empty())
    throw std::runtime_error(cuda.built ? "--gpu: " + cuda.reason
                                        : std::string("--gpu: this build has no CUDA backend (nvcc was not found when it was configured)"));
  if (!a.gpu) {
    if (cuda.devices.empty())
      cli::logger().info("{}; using the CPU backend", cuda.reason);
    else
      cli::logger().info("CUDA device {} found; using the CPU backend (pass --gpu to run on it)", cuda.devices[0].name);
  }
  const auto t_load = std::chrono::steady_clock::now();
  models::load_options lo;
  lo.own_weights = !a.vram && !a.gpu;  // with --vram or --gpu the arbiter holds the weights (packed as segments are filled on the CPU)
  lo.pack_weights = !a.gpu;            // the CUDA kernels read the file layout
  models::model m(a.model, lo);
  const auto tok = models::tokenizer::from_gguf(m.file());
  models::check_tokenizer_matches(tok, m.config(), a.model);
  cli::logger().info("loaded {} ({}, {} layers, {:.1f} MiB) in {:.2f} s", a.model, models::architecture_name(m.config().arch), m.config().n_layer,
                     m.weight_bytes() / 1048576.0, std::chrono::duration<double>(std::chrono::steady_clock::now() - t_load).count());

  std::unique_ptr<models::model> draft;
  std::optional<models::tokenizer> draft_tok;
  if (!a.draft.empty()) {
    draft = std::make_unique<models::model>(a.draft, lo);
    draft_tok = models::tokenizer::from_gguf(draft->file());
    models::check_tokenizer_matches(*draft_tok, draft->config(), a.draft);
    cli::logger().info("draft {} ({}, {:.1f} MiB){}", a.draft, models::architecture_name(draft->config().arch), draft->weight_bytes() / 1048576.0,
                       runtime::same_vocabulary(tok, *draft_tok) ? "" : ", another vocabulary: its guesses pass through text");
  }

  const auto prompt = build_prompt(a, m, tok);
  // Without --ctx-size the cache holds exactly what this run needs (prompt + tokens to
  // generate, or 4096 when generating until the end), never more than the training context.
  const int64_t need = static_cast<int64_t>(prompt.size()) + 1 + (a.n_predict >= 0 ? a.n_predict : 4096);
  const int64_t n_ctx = a.n_ctx > 0 ? a.n_ctx : std::min(m.config().n_ctx_train, need);
  const auto kv = cli::kv_type_of(a.kv);
  const bool kv_rotate = cli::kv_rotate_of(a.kv);
  const std::string name = std::filesystem::path(a.model).stem().string();
  constexpr int64_t k_pass_rows = 512;  // a prompt of up to this many tokens is one pass, as llama.cpp's n_batch

  // The one request goes through a one-model engine: the serving loop (passes, sampling,
  // streaming, stop conditions), computed with llama.cpp's arithmetic (generation_params::exact).
  runtime::engine_model em;
  em.name = name;
  em.model = &m;
  em.tokenizer = &tok;
  em.max_sequences = 1;
  em.context = n_ctx;
  em.kv = kv;
  em.kv_rotate = kv_rotate;
  if (a.draft_ngram) em.speculate = {runtime::spec_method::ngram, a.draft_max};
  // The draft: one sequence slot mirroring the request's; another vocabulary may spell the same
  // text in several times the tokens.
  runtime::engine_model dm;
  int64_t draft_ctx = 0;
  if (draft) {
    std::string dname = std::filesystem::path(a.draft).stem().string();
    if (dname == name) dname += "-draft";
    em.speculate = {runtime::spec_method::draft, a.draft_max};
    em.draft = dname;
    draft_ctx = std::min(models::k_max_context, runtime::same_vocabulary(tok, *draft_tok) ? n_ctx : 4 * n_ctx);
    dm = {dname, draft.get(), &*draft_tok, 0, 1, draft_ctx};
    dm.kv = kv;
    dm.kv_rotate = kv_rotate;
  }
  std::unique_ptr<runtime::placed_model> placed, placed_draft;
  if (a.vram || a.gpu) {
    // The draft wholly on the device beside the target: on a GPU its room comes out of the
    // device's; with --vram (a simulated device) it gets a budget of its own, the target keeps --vram.
    const uint64_t draft_bytes = draft ? draft_device_bytes(*draft, draft_ctx, dm, k_pass_rows) : 0;
    // --gpu: the device's memory, less a margin for the CUDA context and cuBLAS.
    uint64_t device = a.gpu ? cuda.devices[0].total_bytes / 10 * 9 : *a.vram;
    if (a.gpu && draft) {
      if (draft_bytes >= device)
        throw std::runtime_error("--draft: the draft needs " + configs::format_byte_size(draft_bytes) + ", more than the device has");
      device -= draft_bytes;
    }
    placed = place_for_run(a, m, name, n_ctx, device, k_pass_rows, em);
    if (draft) placed_draft = place_for_run(a, *draft, dm.name, draft_ctx, draft_bytes, k_pass_rows, dm);
  }
  runtime::engine_config ec;
  ec.threads = a.threads;
  ec.max_batch_tokens = k_pass_rows;
  ec.prefill_chunk = k_pass_rows;
  ec.prefix_cache = false;
  std::vector<runtime::engine_model> entries{em};
  if (draft) entries.push_back(dm);
  runtime::engine eng(std::move(entries), ec);

  runtime::engine_request rq;
  rq.model = name;
  rq.prompt = prompt;
  // -n -1: until end of generation or a full context.
  rq.params.max_tokens = a.n_predict >= 0 ? a.n_predict : n_ctx;
  rq.params.sampling = a.sampling;
  rq.params.sampling.seed = a.has_seed ? a.seed : std::random_device{}();
  rq.params.exact = true;
  if (!a.grammar_file.empty() || !a.schema_file.empty()) {
    const std::string path = a.grammar_file.empty() ? a.schema_file : a.grammar_file;
    std::ifstream in(path, std::ios::binary);
    if (!in) throw std::runtime_error("cannot read " + path);
    const std::string text{std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
    try {
      const std::string gbnf = a.grammar_file.empty() ? runtime::json_schema_to_gbnf(nlohmann::ordered_json::parse(text)) : text;
      rq.params.constraint = std::make_shared<const runtime::grammar>(runtime::parse_gbnf(gbnf));
    } catch (const std::exception& e) {
      throw std::runtime_error(path + ": " + e.what());
    }
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto h = eng.submit(std::move(rq));
  runtime::piece p;
  int64_t generated = 0;
  std::optional<std::chrono::steady_clock::time_point> first;
  while (h->next(&p)) {
    std::fwrite(p.text.data(), 1, p.text.size(), stdout);
    std::fflush(stdout);
    if (p.token < 0) continue;
    ++generated;
    if (!first) first = p.at;
  }
  if (h->finished() == runtime::finish_reason::error) throw std::runtime_error(h->error());
  const auto end = h->finished_at();
  const double prompt_s = std::chrono::duration<double>(first.value_or(end) - t0).count();
  // The first token's sampling is counted with the prompt, every later pass with generation.
  const double gen_s = first ? std::chrono::duration<double>(end - *first).count() : 0;
  std::string where;
  if (a.gpu)
    where = placed->backend->info().name;
  else
    where = fmt::format("threads {}, {}", a.threads > 0 ? a.threads : kernels::cpu::default_thread_count(), kernels::cpu::active_path_name());
  std::fputc('\n', stdout);
  std::fflush(stdout);
  if (em.speculate.method != runtime::spec_method::off) {
    const auto sp = h->speculation();
    const auto st = eng.stats(name);
    where += fmt::format(" | speculation: {} of {} proposed tokens accepted ({:.0f}%), {:.2f} tokens per verifying pass", sp.accepted, sp.proposed,
                         sp.proposed > 0 ? 100.0 * static_cast<double>(sp.accepted) / static_cast<double>(sp.proposed) : 0.0,
                         st.spec_passes > 0 ? static_cast<double>(st.spec_tokens) / static_cast<double>(st.spec_passes) : 0.0);
  }
  std::fprintf(stderr, "prompt: %lld tokens, %.1f tok/s | generated: %lld tokens, %.1f tok/s | %s\n", static_cast<long long>(prompt.size()),
               prompt_s > 0 ? static_cast<double>(prompt.size()) / prompt_s : 0.0, static_cast<long long>(generated),
               gen_s > 0 && generated > 1 ? static_cast<double>(generated - 1) / gen_s : 0.0, where.c_str());
}

void add_run_command(CLI::App& root) {
  auto a = std::make_shared<run_args>();
  auto* cmd = root.add_subcommand("run", "Generate text from a GGUF model (CPU, or the GPU with --gpu)");
  cmd->add_option("-m,--model", a->model, "GGUF model file")->required()->check(CLI::ExistingFile);
  cmd->add_option("-p,--prompt", a->prompt, "prompt text (continued as is)");
  cmd->add_option("--chat", a->chat, "a user message, wrapped in the model's chat template; stops at end of turn");
  cmd->add_option("--system", a->system, "system message for --chat");
  cmd->add_flag("--default-system", a->default_system,
                "without --system, use the default system prompt the model's template injects (as Jinja rendering does)");
  cmd->add_option("--chat-template", a->chat_template,
                  "template family instead of the detected one: chatml, llama2, llama3, mistral, gemma, phi3, deepseek, zephyr, plain");
  cmd->add_option("-n,--n-predict", a->n_predict, "tokens to generate (-1: until end of generation or context full)")
      ->check(CLI::Range(int64_t{-1}, models::k_max_context));
  cmd->add_option("-c,--ctx-size", a->n_ctx, "context size (default: prompt + tokens to generate, at most the training context)")
      ->check(CLI::Range(int64_t{0}, models::k_max_context));
  cmd->add_option("-t,--threads", a->threads, "threads (0: all cores)")->check(CLI::Range(0, 1024));
  cli::add_kv_options(cmd, a->kv);
  cmd->add_option("--temp", a->sampling.temperature, "temperature (0: greedy)")->check(CLI::Range(0.0f, 100.0f));
  cmd->add_option("--top-k", a->sampling.top_k, "top-k (0: off)")->check(CLI::Range(0, 1 << 24));
  cmd->add_option("--top-p", a->sampling.top_p, "top-p (1: off)")->check(CLI::Range(0.0f, 1.0f));
  cmd->add_option("--min-p", a->sampling.min_p, "min-p (0: off)")->check(CLI::Range(0.0f, 1.0f));
  // Must be > 0: 0 divides positive logits by zero (a repeated token becomes certain) and a
  // negative value flips signs. Checked here (the sampler checks too) to name the flag.
  cmd->add_option("--repeat-penalty", a->sampling.repeat_penalty, "repetition penalty, > 0 and <= 10 (1: off)")
      ->check(CLI::Validator(
          [](std::string& s) -> std::string {
            char* end = nullptr;
            const float v = std::strtof(s.c_str(), &end);
            if (end == s.c_str() || *end != '\0' || !(v > 0.0f && v <= 10.0f))
              return "repetition penalty must be a number > 0 and <= 10 (1: off), got '" + s + "'";
            return {};
          },
          "(0, 10]"));
  cmd->add_option("--repeat-last-n", a->sampling.repeat_last_n, "tokens the penalty looks back (-1: all)")->check(CLI::Range(-1, 1 << 24));
  cmd->add_option_function<std::string>(
         "--vram", [a](const std::string& v) { a->vram = configs::parse_byte_size(v); },
         "device memory budget: weights and KV live in it, layers that do not fit are streamed (e.g. 512MiB)")
      ->check(byte_size_validator());
  cmd->add_option_function<std::string>(
         "--host-ram", [a](const std::string& v) { a->host_ram = configs::parse_byte_size(v); },
         "pinned host memory budget for staged weights (default: the model's size); needs --vram")
      ->check(byte_size_validator());
  cmd->add_option("--link-gbps", a->link_gbps, "throttle host<->device copies to this many GB/s on the CPU backend (simulated PCIe; 0: off)")
      ->check(CLI::Range(0.0, 10000.0));
  cmd->add_flag("--no-stream", a->no_stream, "with --vram: refuse to run a model whose weights do not all fit on the device");
  cmd->add_option("--prefetch-depth", a->prefetch_depth, "with --vram: segments copied ahead of the one computing when streaming")
      ->check(CLI::Range(0, 64))
      ->capture_default_str();
  auto* draft = cmd->add_option("--draft", a->draft, "speculative decoding: a smaller model's guesses, verified (another vocabulary is fine)")
                    ->check(CLI::ExistingFile);
  cmd->add_flag("--draft-ngram", a->draft_ngram, "speculative decoding: guesses by n-gram lookup over the prompt and output")->excludes(draft);
  cmd->add_option("--draft-max", a->draft_max, "speculative decoding: guesses verified in one pass, at most")
      ->check(CLI::Range(int64_t{1}, int64_t{32}))
      ->capture_default_str()
      ->each([a](const std::string&) { a->draft_max_given = true; });
  auto* grammar =
      cmd->add_option("--grammar", a->grammar_file, "constrain the output to a GBNF grammar (llama.cpp's format)")->check(CLI::ExistingFile);
  cmd->add_option("--json-schema", a->schema_file, "constrain the output to JSON of this JSON Schema file")
      ->check(CLI::ExistingFile)
      ->excludes(grammar);
  cmd->add_flag("--gpu", a->gpu, "run on the CUDA device, the weights resident in its memory (CUDA builds)");
  cmd->add_option("--seed", a->seed, "random seed (default: random)")->each([a](const std::string&) { a->has_seed = true; });
  cmd->callback([a] { run(*a); });
}

const command_registrar reg{"run", &add_run_command};

}  // namespace
}  // namespace tandem::cli
