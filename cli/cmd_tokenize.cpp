// `tandem tokenize`: print the token ids of a text as one JSON array on one line. Reads only
// the tokenizer metadata of the GGUF file (no weights are touched).
#include <nlohmann/json.hpp>

#include <cstdio>
#include <memory>
#include <string>

#include "cli/command_registry.h"
#include "models/gguf_reader.h"
#include "models/tokenizer.h"

namespace tandem::cli {
namespace {

struct tokenize_args {
  std::string model;
  std::string text;
  bool no_bos = false;
  bool special = false;
};

void tokenize(const tokenize_args& a) {
  const models::gguf_file f(a.model);
  const auto tok = models::tokenizer::from_gguf(f);
  const auto ids = tok.encode(a.text, tok.add_bos() && !a.no_bos, a.special);
  const std::string line = nlohmann::json(ids).dump();
  std::fwrite(line.data(), 1, line.size(), stdout);
  std::fputc('\n', stdout);
  std::fflush(stdout);
}

void add_tokenize_command(CLI::App& root) {
  auto a = std::make_shared<tokenize_args>();
  auto* cmd = root.add_subcommand("tokenize", "Print the token ids of a text as a JSON array");
  cmd->add_option("-m,--model", a->model, "GGUF file (only its tokenizer metadata is read)")->required()->check(CLI::ExistingFile);
  cmd->add_flag("--no-bos", a->no_bos, "do not add the BOS token even if the model asks for one");
  cmd->add_flag("--special", a->special, "parse special tokens written in the text, e.g. <|im_start|>");
  cmd->add_option("text", a->text, "text to tokenize")->required();
  cmd->callback([a] { tokenize(*a); });
}

const command_registrar reg{"tokenize", &add_tokenize_command};

}  // namespace
}  // namespace tandem::cli
