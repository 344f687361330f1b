// Everything one `tandem serve` process runs, built from a roster: the backend and arbiter of
// the roster's device, every model opened (GGUF mapped, tokenizer, chat template), its KV pool
// and weight segments registered with the arbiter, what the roster preloads staged or loaded,
// and the engine that places and serves them by the roster's policy. The HTTP layer looks
// models up here by name or alias and submits to engine().
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <span>
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
  // chat template is unknown, or the device cannot hold what the roster asks (kv_reserve
  // floors, a model that could not run even alone); std::invalid_argument for a roster of more
  // than one device.
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

// The cache element type of a roster's kv_type.
kernels::cpu::kv_type kv_type_of(configs::kv_cache_type t);
spec_method spec_method_of(configs::speculate_method m);
// Whether the entry's KV is rotated: kv_rotate, else models::default_kv_rotate of its type.
bool kv_rotate_of(const configs::model_entry& e);

// KV blocks of max_sequences sequences of a model's whole context, in blocks of
// configs::k_kv_block_tokens positions.
int32_t kv_blocks_for(const configs::model_entry& e);

// A model's elastic KV pool as its roster entry sets it: blocks of block_bytes, each a page of
// page_bytes of the device tier (rounded up to the arbiter's allocation unit `unit`); at most
// limit_blocks (kv_blocks_for, or fewer under kv_limit), reserve_blocks of them kept from the
// start (kv_reserve, rounded up to whole pages). Throws std::runtime_error naming the model
// and its line for a kv_limit below one page.
struct kv_shape {
  uint64_t block_bytes = 0, page_bytes = 0;
  int32_t limit_blocks = 0;
  int32_t reserve_blocks = 0;
};
kv_shape kv_shape_for(const configs::model_entry& e, uint64_t bytes_per_token, size_t unit);

// The arbiter's allocation unit for a roster whose models' KV blocks are these sizes: the
// largest power of two from memory::k_default_block_bytes (64 KiB) down to k_min_page_unit
// that divides every block, so each block is a whole number of units and a page wastes
// nothing (real models' blocks are multiples of 16 KiB; tiny test models' of 2 KiB).
inline constexpr size_t k_min_page_unit = 1024;
size_t kv_page_unit(std::span<const uint64_t> block_bytes);

}  // namespace tandem::runtime
