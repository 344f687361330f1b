// The KV cache options `tandem run` and `tandem perplexity` share: --kv-type and --kv-rotate.
#pragma once

#include <CLI/CLI.hpp>

#include <string>

#include "kernels/cpu/ops.h"

namespace tandem::cli {

struct kv_options {
  std::string type = "f16";
  std::string rotate = "auto";  // on, off, auto (models::default_kv_rotate)
};

// Adds both options to cmd, checked against their choices.
void add_kv_options(CLI::App* cmd, kv_options& o);

kernels::cpu::kv_type kv_type_of(const kv_options& o);
bool kv_rotate_of(const kv_options& o);

}  // namespace tandem::cli
