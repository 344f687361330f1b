// Facts about a served model's file that model listings show: family, parameter count,
// dominant quantization, and a stable identity for Ollama's `digest`.
#pragma once

#include <cstdint>
#include <string>

#include "runtime/served_roster.h"

namespace tandem::api {

struct model_details {
  std::string family;          // "llama", "qwen2", "qwen3"
  uint64_t parameters = 0;     // elements of every tensor
  std::string parameter_size;  // "135M", "7.2B"
  std::string quantization;    // the weight type holding most bytes of the 2-D tensors ("Q4_0")
  // 64 hex digits identifying the file (path, size, modification time): Ollama clients
  // compare digests to see a model change; hashing the content would read whole files.
  std::string digest;
  bool fim = false;  // has fill-in-the-middle tokens
};

model_details details_of(const runtime::served_model& m);

}  // namespace tandem::api
