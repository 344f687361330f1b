// `tandem synth`: write a GGUF model with random weights and a real tokenizer (see
// models/synth.h). Notes and a one-line summary go to stderr; stdout stays empty.
#include <cstdio>
#include <memory>
#include <string>

#include "cli/command_registry.h"
#include "models/synth.h"

namespace tandem::cli {
namespace {

struct synth_args {
  models::synth_options opt;
  std::string type = "f16";
  std::string out;
};

std::string human_count(double n) {
  const char* units[] = {"", "K", "M", "B"};
  int u = 0;
  while (n >= 1000 && u < 3) n /= 1000, ++u;
  char buf[32];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f%s" : "%.2f%s", n, units[u]);
  return buf;
}

void synth(synth_args& a) {
  const auto t = kernels::parse_weight_type(a.type);
  if (!t) throw std::invalid_argument("synth: --type '" + a.type + "' is not a weight type (e.g. f16, q8_0, q4_k)");
  a.opt.type = *t;
  const auto r = models::synth_model(a.opt, a.out);
  for (const auto& n : r.notes) std::fprintf(stderr, "synth: note: %s\n", n.c_str());
  std::fprintf(stderr, "synth: wrote %s: %s %s parameters, %.2f MiB (%s), %.2f s\n", a.out.c_str(), a.opt.arch.c_str(),
               human_count(static_cast<double>(r.parameters)).c_str(), static_cast<double>(r.bytes) / (1 << 20),
               kernels::display_name(a.opt.type).c_str(), r.seconds);
}

void add_synth_command(CLI::App& root) {
  auto a = std::make_shared<synth_args>();
  auto& o = a->opt;
  auto* cmd = root.add_subcommand("synth", "Write a GGUF model with deterministic random weights and a real tokenizer");
  cmd->add_option("--arch", o.arch, "architecture")->required()->check(CLI::IsMember({"llama", "qwen2", "qwen3"}));
  cmd->add_option("--dim", o.dim, "embedding size")->required();
  cmd->add_option("--layers", o.layers, "number of transformer blocks")->required();
  cmd->add_option("--heads", o.heads, "attention heads")->required();
  cmd->add_option("--kv-heads", o.kv_heads, "key/value heads (default: --heads)");
  cmd->add_option("--ffn", o.ffn, "feed-forward size")->required();
  cmd->add_option("--context", o.context, "context length")->capture_default_str();
  cmd->add_option("--head-dim", o.head_dim, "per-head size (llama, qwen3; default dim / heads)");
  cmd->add_flag("--tied", o.tied, "no output.weight: the output reuses token_embd");
  cmd->add_option("--vocab-from", o.vocab_path, "GGUF whose tokenizer is copied")->required()->check(CLI::ExistingFile);
  cmd->add_option("--type", a->type, "type of the 2-D tensors (f32, f16, bf16, q4_0, q4_1, q5_0, q5_1, q8_0, q4_k, q5_k, q6_k)")->required();
  cmd->add_option("--seed", o.seed, "random seed")->required();
  cmd->add_option("--name", o.name, "general.name (default synth-<arch>)");
  cmd->add_option("-t,--threads", o.threads, "generator threads (default: one per core for large tensors)");
  cmd->add_option("out", a->out, "output GGUF path")->required();
  cmd->callback([a] { synth(*a); });
}

const command_registrar reg{"synth", &add_synth_command};

}  // namespace
}  // namespace tandem::cli
