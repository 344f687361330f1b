// The roster: what one tandem process serves, on which device budgets, and how the policy
// weighs its models. Plain, validated structs; `roster_loader.h` reads them from YAML.
// The format, key by key: configs/README.md and configs/roster.schema.json.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "configs/duration.h"

namespace tandem::configs {

struct server_limits {
  uint64_t max_body_bytes = 8ull << 20;  // request body
  int max_queue = 256;                   // waiting requests per model; more get 429
  int max_connections = 256;
  int64_t max_tokens = 4096;  // cap on max_tokens of one request
  duration request_timeout{std::chrono::minutes(10)};
  duration idle_timeout{std::chrono::seconds(60)};  // a keep-alive connection with no request
};

struct server_config {
  std::string listen = "127.0.0.1:8080";
  std::vector<std::string> api_keys;    // empty: no authentication
  std::vector<std::string> admin_keys;  // empty: admin routes only from loopback
  server_limits limits;
};

enum class backend_choice { automatic, cuda, cpu };

struct device_config {
  std::string name = "device0";
  backend_choice backend = backend_choice::automatic;
  uint64_t vram = 0;     // device budget
  uint64_t host = 0;     // pinned host budget
  double link_gbps = 0;  // CPU backend: simulated host<->device link (0: not throttled)
  int line = 0;
};

enum class model_role { chat, code, draft, medusa };
enum class preload_tier { none, host, device };
enum class kv_cache_type { f16, f32, q8_0, q4_0 };

// Bytes a cache of type t takes for what an f16 cache holds in f16_bytes: f32 twice as much,
// q8_0 17/32 (34 bytes a block of 32 elements), q4_0 9/32 (18 bytes), rounded up.
inline uint64_t kv_bytes_from_f16(uint64_t f16_bytes, kv_cache_type t) {
  switch (t) {
    case kv_cache_type::f32:
      return f16_bytes * 2;
    case kv_cache_type::q8_0:
      return (f16_bytes * 17 + 31) / 32;
    case kv_cache_type::q4_0:
      return (f16_bytes * 9 + 31) / 32;
    case kv_cache_type::f16:
      break;
  }
  return f16_bytes;
}

// keep_alive: how long an idle model stays where it is. forever: never expires (-1);
// 0: evicted as soon as it is idle.
struct keep_alive_setting {
  bool forever = false;
  duration after{std::chrono::minutes(5)};  // Ollama's default
};

// speculate: how a model's decode proposes tokens to verify (runtime/speculation.h).
enum class speculate_method { off, ngram, draft };
struct speculate_config {
  speculate_method method = speculate_method::off;  // default: draft when a draft is attached
  int max_tokens = 8;                               // proposals verified in one pass, at most
  bool cache = false;                               // ngram: look in the model's recent outputs too
};

struct model_entry {
  std::string name;
  std::vector<std::string> aliases;
  std::string path;  // as written; resolved against the roster's folder in `file`
  std::string file;  // the GGUF path to open
  model_role role = model_role::chat;
  int priority = 0;     // higher wins; 0..1000
  bool pinned = false;  // never leaves the device
  keep_alive_setting keep_alive;
  preload_tier preload = preload_tier::none;
  int64_t context = 4096;  // KV positions per sequence (a limit: KV pages are taken as used)
  int max_sequences = 4;   // concurrent sequences (a limit)
  kv_cache_type kv_type = kv_cache_type::f16;
  // Keys and values rotated per head before they are stored (Hadamard; models/forward.h).
  // Unset: rotated for q4_0 only.
  std::optional<bool> kv_rotate;
  // KV bytes on the device the model always keeps, taken at start (a code model's next
  // completion then never waits for pages), and the most it may hold (default: context x
  // max_sequences). Elastic in between: pages come from the device pool all models share.
  uint64_t kv_reserve = 0;
  std::optional<uint64_t> kv_limit;
  std::string draft;  // a draft model entry speculating for this one
  speculate_config speculate;
  std::string medusa;         // a medusa entry attached to this one
  std::string chat_template;  // built-in template name; empty: detected from the file
  // Stated sizes, so `tandem sim` and `serve --check` work without the file; `serve`
  // cross-checks them against the file.
  std::optional<uint64_t> size_bytes;
  std::optional<uint64_t> kv_bytes_per_token;  // at kv_type (the YAML states the f16 figure)
  // A model served when its file is there and left out (with a note) when it is not, so one
  // roster runs whether or not an optional download happened.
  bool optional = false;
  bool missing = false;  // set by the loader for an optional model without its file
  int line = 0;          // where the entry starts, for later messages
};

struct policy_config {
  std::string name = "tandem";                    // tandem | exclusive | lru-keepalive | static
  std::string home;                               // a model that returns to the device after another's burst
  duration hysteresis{std::chrono::seconds(2)};   // minimum residency before a model may be evicted for another
  duration max_wait{std::chrono::seconds(10)};    // aging: a waiting request's priority rises until it is served within this
  bool prefetch = true;                           // when idle, stage the likeliest next model
  duration idle_grace{std::chrono::seconds(30)};  // an idle model gives way to a lower-priority demand after this
  bool stream = true;                             // run a model that cannot get the whole device in part, streaming the rest
  // Work of a higher-priority model whose weights are all on the device runs between the
  // layers of a lower-priority model's pass, instead of after it (tandem policy only).
  bool interleave = true;
  // While a model's sequences decode, a pass that also carries prompt rows may take up to
  // itl_target, or itl_budget times a pass of decode rows alone, whichever is longer: prompt
  // rows fill each pass up to that (docs/executor.md). Both 0: prompt chunks whatever they cost.
  duration itl_target{std::chrono::milliseconds(50)};
  double itl_budget = 2.0;
};

struct roster {
  std::string source;  // the file it came from
  server_config server;
  std::vector<device_config> devices;
  std::vector<model_entry> models;
  policy_config policy;
  std::vector<std::string> skipped;  // optional models left out, with why

  // The model with this name or alias, or null.
  const model_entry* find(const std::string& name_or_alias) const;
};

// Positions of one KV block (a page of the device's KV pool holds one block of a model).
inline constexpr int64_t k_kv_block_tokens = 16;

// Bytes of KV a model may hold at most (kv_limit, else context x max_sequences x per token),
// when the per-token figure is known.
std::optional<uint64_t> kv_budget_bytes(const model_entry& m);

const char* role_name(model_role r);
const char* speculate_method_name(speculate_method m);
const char* preload_name(preload_tier p);
const char* backend_name(backend_choice b);

}  // namespace tandem::configs
