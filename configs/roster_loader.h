// Reads a roster from YAML into validated plain structs (roster.h). Every problem is a
// config_error whose message starts with "FILE:LINE:COLUMN: key.path:" and says what was
// expected: malformed YAML, unknown keys, wrong types, values out of range, duplicate model
// names or aliases, dangling draft / medusa references, missing model files, budgets that
// cannot hold what the roster pins or preloads.
#pragma once

#include <stdexcept>
#include <string>
#include <string_view>

#include "configs/roster.h"

namespace tandem::configs {

class config_error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct roster_options {
  // Model files must exist (tandem serve). Off (tandem sim, serve --check): a model whose file
  // is absent must state its size and KV bytes per token instead.
  bool require_files = true;
};

roster load_roster(const std::string& path, const roster_options& options = {});
// `source` names the text in messages; relative model paths resolve against `base_dir`.
roster parse_roster(std::string_view yaml, const std::string& source, const std::string& base_dir, const roster_options& options = {});

}  // namespace tandem::configs
