#include "cli/kv_options.h"

#include "models/forward.h"

namespace tandem::cli {

void add_kv_options(CLI::App* cmd, kv_options& o) {
  cmd->add_option("--kv-type", o.type, "KV cache type: f16 (as llama.cpp), f32, q8_0 or q4_0")
      ->check(CLI::IsMember({"f16", "f32", "q8_0", "q4_0"}))
      ->capture_default_str();
  cmd->add_option("--kv-rotate", o.rotate, "rotate keys and values per head (Hadamard) before storing them: on, off, auto (on for q4_0)")
      ->check(CLI::IsMember({"on", "off", "auto"}))
      ->capture_default_str();
}

kernels::cpu::kv_type kv_type_of(const kv_options& o) {
  using kernels::cpu::kv_type;
  if (o.type == "f32") return kv_type::f32;
  if (o.type == "q8_0") return kv_type::q8_0;
  if (o.type == "q4_0") return kv_type::q4_0;
  return kv_type::f16;
}

bool kv_rotate_of(const kv_options& o) { return o.rotate == "auto" ? models::default_kv_rotate(kv_type_of(o)) : o.rotate == "on"; }

}  // namespace tandem::cli
