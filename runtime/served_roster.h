// Everything one `tandem serve` process runs, built from a roster: the backend and arbiter of
// the roster's device, every model opened (GGUF mapped, tokenizer, chat template), its KV pool
// and weight segments registered with the arbiter, what the roster preloads staged or loaded,
// and the engine that places and serves them by the roster's policy. The HTTP layer looks
// models up here by name or alias and submits to engine().
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "configs/roster.h"
#include "memory/arbiter.h"
#include "memory/backend.h"
#include "memory/kv_pool.h"
#include "models/arbiter_residency.h"
#include "models/chat_template.h"
#include "models/model.h"
#include "models/tokenizer.h"
#include "runtime/engine.h"

namespace tandem::runtime {

struct serve_options {
  int threads = 0;  // compute threads of the engine; 0: all cores
  int64_t max_batch_tokens = 256;
  int64_t prefill_chunk = 128;
  // The ITL target and budget come from the roster's policy (itl_target, itl_budget).
};

struct served_model {
  const configs::model_entry* entry = nullptr;  // in served_roster::roster()
  std::unique_ptr<models::model> model;
  std::unique_ptr<models::tokenizer> tokenizer;
  models::chat_template chat;
  std::unique_ptr<memory::kv_pool> kv;
  std::unique_ptr<models::arbiter_residency> placement;
  uint64_t file_bytes = 0;
  std::chrono::system_clock::time_point created{};  // the file's modification time
  const std::string& name() const { return entry->name; }
};

class served_roster {
 public:
  // Throws std::runtime_error naming the model and file when a model cannot be opened, its
  // chat template is unknown, or the device cannot hold what the roster asks (KV pools, a
  // model that could not run even alone); std::invalid_argument for a roster of more than one
  // device.
  served_roster(const configs::roster& r, const serve_options& o);
  ~served_roster();  // the engine first (it finishes what runs), then placements, pools, arbiter
  served_roster(const served_roster&) = delete;
  served_roster& operator=(const served_roster&) = delete;

  const configs::roster& roster() const { return roster_; }
  engine& executor() { return *engine_; }
  memory::arbiter& arbiter() { return *arbiter_; }
  const memory::backend& backend() const { return *backend_; }
  const std::vector<std::unique_ptr<served_model>>& models() const { return models_; }
  // By name or alias; null when neither matches.
  const served_model* find(std::string_view name_or_alias) const;
  // False while a model the roster preloads to the device still has copies landing.
  bool ready() const;

 private:
  configs::roster roster_;
  std::unique_ptr<memory::backend> backend_;
  std::unique_ptr<memory::arbiter> arbiter_;
  std::vector<std::unique_ptr<served_model>> models_;
  std::unique_ptr<engine> engine_;
};

// The device budget's KV blocks for one model: max_sequences sequences of its whole context,
// in blocks of 16 positions.
int32_t kv_blocks_for(const configs::model_entry& e);

}  // namespace tandem::runtime
