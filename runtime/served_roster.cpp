#include "runtime/served_roster.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <stdexcept>

#include <spdlog/spdlog.h>

#include "runtime/log.h"
#include "configs/byte_size.h"
#include "models/forward.h"
#include "runtime/memory_plan.h"

#if defined(TANDEM_HAVE_CUDA)
#include "models/cuda/gpu_forward.h"
#endif

namespace tandem::runtime {

namespace {

constexpr int64_t k_block_tokens = 16;  // the engine's KV block size

memory::backend_kind backend_kind_of(configs::backend_choice c) {
  switch (c) {
    case configs::backend_choice::cuda:
      return memory::backend_kind::cuda;
    case configs::backend_choice::cpu:
      return memory::backend_kind::cpu;
    case configs::backend_choice::automatic:
      break;
  }
  return memory::backend_kind::automatic;
}

kernels::cpu::kv_type kv_type_of(configs::kv_cache_type t) {
  return t == configs::kv_cache_type::f32 ? kernels::cpu::kv_type::f32 : kernels::cpu::kv_type::f16;
}

std::chrono::system_clock::time_point modified(const std::string& path) {
  std::error_code ec;
  const auto t = std::filesystem::last_write_time(path, ec);
  if (ec) return std::chrono::system_clock::now();
  return std::chrono::time_point_cast<std::chrono::system_clock::duration>(t - decltype(t)::clock::now() + std::chrono::system_clock::now());
}

}  // namespace

int32_t kv_blocks_for(const configs::model_entry& e) {
  return static_cast<int32_t>(e.max_sequences * ((e.context + k_block_tokens - 1) / k_block_tokens));
}

served_roster::served_roster(const configs::roster& r, const serve_options& o) : roster_(r) {
  using configs::format_byte_size;
  if (roster_.devices.size() != 1)
    throw std::invalid_argument(roster_.source + ": tandem serves one device per process; the roster lists " +
                                std::to_string(roster_.devices.size()));
  const auto& dev = roster_.devices.front();
  backend_ = memory::make_backend({backend_kind_of(dev.backend), dev.link_gbps});
  // A backend whose device memory the host cannot read is a GPU: the engine computes its
  // models with the CUDA forward pass, which reads weights in their file layout. A model it
  // cannot run (a weight type without CUDA kernels) is refused, naming it, whether the roster
  // asks for CUDA or `auto`: moving the whole roster to the CPU for one model would make every
  // other model an order of magnitude slower without a word in the roster saying so.
  const bool gpu = !backend_->device_host_addressable();
#if defined(TANDEM_HAVE_CUDA)
  for (const auto& e : roster_.models) {
    if (!gpu) break;
    std::string why;
    try {
      why = models::gpu_unsupported(models::model(e.file, {.pack_weights = false, .own_weights = false}));
    } catch (const std::exception&) {
      continue;  // an unreadable file is reported, naming it, when the models are opened below
    }
    if (why.empty()) continue;
    runtime::logger().error("serve: model '{}' cannot run on {}: {}", e.name, backend_->info().name, why);
    throw std::runtime_error(roster_.source + ": model '" + e.name + "' cannot run on " + backend_->info().name +
                             " (devices[0].backend: " + (dev.backend == configs::backend_choice::cuda ? "cuda" : "auto") + "): " + why +
                             "; set devices[0].backend: cpu to serve the roster on the CPU");
  }
#endif
  arbiter_ = std::make_unique<memory::arbiter>(*backend_, memory::arbiter_config{dev.vram, dev.host});

  std::vector<engine_model> ems;
  for (const auto& e : roster_.models) {
    auto m = std::make_unique<served_model>();
    m->entry = &e;
    const auto t0 = std::chrono::steady_clock::now();
    try {
      // Every served model computes from the arbiter's device copies of its segments (its
      // placement below is its residency): a copy of its own would only double its memory.
      // On a GPU those copies keep the file layout.
      models::load_options lo;
      lo.own_weights = false;
      if (gpu) lo.pack_weights = false;
      m->model = std::make_unique<models::model>(e.file, lo);
      m->tokenizer = std::make_unique<models::tokenizer>(models::tokenizer::from_gguf(m->model->file()));
    } catch (const std::exception& ex) {
      throw std::runtime_error("model '" + e.name + "' (" + e.file + "): " + ex.what());
    }
    m->file_bytes = std::filesystem::file_size(e.file);
    m->created = modified(e.file);
    m->chat = models::chat_template_from_jinja(m->model->file().get_string("tokenizer.chat_template").value_or(""));
    if (!e.chat_template.empty()) {
      const auto k = models::parse_chat_template_name(e.chat_template);
      if (!k) throw std::runtime_error("model '" + e.name + "': unknown chat_template '" + e.chat_template + "'");
      if (*k != m->chat.kind) m->chat = {*k, std::string(models::family_default_system_prompt(*k))};
    }
    // The roster may state sizes for `tandem sim`; say so when the file disagrees.
    if (e.size_bytes && std::abs(static_cast<double>(*e.size_bytes) - static_cast<double>(m->file_bytes)) > 0.05 * static_cast<double>(m->file_bytes))
      runtime::logger().warn("serve: model '{}' states size {} but {} is {}", e.name, format_byte_size(*e.size_bytes), e.file,
                             format_byte_size(m->file_bytes));
    const auto kv = kv_type_of(e.kv_type);
    const uint64_t per_token = models::kv_bytes_per_token(m->model->config(), kv);
    if (e.kv_bytes_per_token && *e.kv_bytes_per_token != per_token)
      runtime::logger().warn("serve: model '{}' states {} KV bytes per token; its file needs {}", e.name, *e.kv_bytes_per_token, per_token);
    if (e.context > m->model->config().n_ctx_train && m->model->config().n_ctx_train > 0)
      runtime::logger().warn("serve: model '{}' runs a context of {} beyond the {} it was trained with", e.name, e.context,
                             m->model->config().n_ctx_train);
    const int32_t blocks = kv_blocks_for(e);
    memory::status st = memory::status::ok;
    m->kv = memory::kv_pool::make(*arbiter_, e.name, blocks, k_block_tokens, static_cast<size_t>(per_token * k_block_tokens), &st);
    if (!m->kv)
      throw std::runtime_error("model '" + e.name + "': its KV cache (" + std::to_string(e.max_sequences) + " x " + std::to_string(e.context) +
                               " positions, " + format_byte_size(static_cast<uint64_t>(blocks) * per_token * k_block_tokens) +
                               ") does not fit beside the others in the device budget of " + format_byte_size(dev.vram));
    m->placement = std::make_unique<models::arbiter_residency>(*arbiter_, *m->model, e.name);
    if (e.preload != configs::preload_tier::none) apply_memory_action(*m->placement, {policy::action_kind::stage, e.name, "preload", 0});
    if (e.preload == configs::preload_tier::device || e.pinned) apply_memory_action(*m->placement, {policy::action_kind::load, e.name, "preload", 0});
    runtime::logger().info("serve: {} ({}, {} {}, {} x {} positions) opened in {:.0f} ms", e.name, e.file,
                           models::architecture_name(m->model->config().arch), format_byte_size(m->file_bytes), e.max_sequences, e.context,
                           std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    engine_model em;
    em.name = e.name;
    em.model = m->model.get();
    em.tokenizer = m->tokenizer.get();
    em.priority = e.priority;
    em.max_sequences = e.max_sequences;
    em.context = e.context;
    em.kv = kv;
    em.kv_pool = m->kv.get();
    em.placement = m->placement.get();
    em.max_queue = roster_.server.limits.max_queue;
    ems.push_back(em);
    models_.push_back(std::move(m));
  }
  engine_config ec;
  ec.threads = o.threads;
  ec.max_batch_tokens = o.max_batch_tokens;
  ec.prefill_chunk = o.prefill_chunk;
  ec.itl_budget = roster_.policy.itl_budget;
  ec.itl_target = roster_.policy.itl_target;
  ec.roster = &roster_;
  try {
    engine_ = std::make_unique<engine>(std::move(ems), ec);
  } catch (const std::invalid_argument& ex) {
    throw std::runtime_error(roster_.source + ": " + ex.what());
  }
}

served_roster::~served_roster() {
  engine_.reset();
  models_.clear();
  arbiter_.reset();
}

const served_model* served_roster::find(std::string_view name_or_alias) const {
  const auto* e = roster_.find(std::string(name_or_alias));
  if (!e) return nullptr;
  for (const auto& m : models_)
    if (m->entry == e) return m.get();
  return nullptr;
}

bool served_roster::ready() const {
  const auto snap = arbiter_->snapshot();
  for (const auto& m : snap.models) {
    const auto* e = roster_.find(m.name);
    if (!e || (e->preload != configs::preload_tier::device && !e->pinned)) continue;
    for (const auto& seg : m.segments)
      if (seg.device == memory::residency::in_flight) return false;
  }
  return true;
}

}  // namespace tandem::runtime
