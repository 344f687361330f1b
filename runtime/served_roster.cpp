#include "runtime/served_roster.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <stdexcept>

#include <spdlog/spdlog.h>

#include "runtime/log.h"
#include "models/chat_jinja.h"
#include "runtime/draft_mirror.h"
#include "configs/byte_size.h"
#include "models/forward.h"
#include "runtime/memory_plan.h"
#include "runtime/roster_check.h"

#if defined(TANDEM_HAVE_CUDA)
#include "models/cuda/gpu_forward.h"
#endif

namespace tandem::runtime {

namespace {

constexpr int64_t k_block_tokens = configs::k_kv_block_tokens;

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

std::chrono::system_clock::time_point modified(const std::string& path) {
  std::error_code ec;
  const auto t = std::filesystem::last_write_time(path, ec);
  if (ec) return std::chrono::system_clock::now();
  return std::chrono::time_point_cast<std::chrono::system_clock::duration>(t - decltype(t)::clock::now() + std::chrono::system_clock::now());
}

}  // namespace

kernels::cpu::kv_type kv_type_of(configs::kv_cache_type t) {
  switch (t) {
    case configs::kv_cache_type::f32:
      return kernels::cpu::kv_type::f32;
    case configs::kv_cache_type::q8_0:
      return kernels::cpu::kv_type::q8_0;
    case configs::kv_cache_type::q4_0:
      return kernels::cpu::kv_type::q4_0;
    case configs::kv_cache_type::f16:
      break;
  }
  return kernels::cpu::kv_type::f16;
}

spec_method spec_method_of(configs::speculate_method m) {
  switch (m) {
    case configs::speculate_method::ngram:
      return spec_method::ngram;
    case configs::speculate_method::draft:
      return spec_method::draft;
    case configs::speculate_method::off:
      break;
  }
  return spec_method::off;
}

bool kv_rotate_of(const configs::model_entry& e) { return e.kv_rotate.value_or(models::default_kv_rotate(kv_type_of(e.kv_type))); }

int32_t kv_blocks_for(const configs::model_entry& e) {
  return static_cast<int32_t>(e.max_sequences * ((e.context + k_block_tokens - 1) / k_block_tokens));
}

size_t kv_page_unit(std::span<const uint64_t> block_bytes) {
  size_t unit = memory::k_default_block_bytes;
  const auto divides_all = [&](size_t u) { return std::all_of(block_bytes.begin(), block_bytes.end(), [&](uint64_t b) { return b % u == 0; }); };
  while (unit > k_min_page_unit && !divides_all(unit)) unit /= 2;
  return unit;
}

kv_shape kv_shape_for(const configs::model_entry& e, uint64_t bytes_per_token, size_t unit) {
  kv_shape k;
  k.block_bytes = bytes_per_token * static_cast<uint64_t>(k_block_tokens);
  k.page_bytes = (k.block_bytes + unit - 1) / unit * unit;
  k.limit_blocks = kv_blocks_for(e);
  if (e.kv_limit) {
    if (*e.kv_limit < k.page_bytes)
      throw std::runtime_error("model '" + e.name + "' (line " + std::to_string(e.line) + "): kv_limit " + configs::format_byte_size(*e.kv_limit) +
                               " is less than one KV page (" + std::to_string(k_block_tokens) + " positions, " +
                               configs::format_byte_size(k.page_bytes) + " of the device)");
    k.limit_blocks = static_cast<int32_t>(std::min<uint64_t>(static_cast<uint64_t>(k.limit_blocks), *e.kv_limit / k.page_bytes));
  }
  k.reserve_blocks =
      static_cast<int32_t>(std::min<uint64_t>((e.kv_reserve + k.page_bytes - 1) / k.page_bytes, static_cast<uint64_t>(k.limit_blocks)));
  return k;
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
  // A draft mirrors its targets' sequences in slots of its own: as many as they run, beside
  // its own requests'.
  for (auto& d : roster_.models) {
    int mirrors = 0;
    for (const auto& t : roster_.models)
      if (t.draft == d.name && t.speculate.method == configs::speculate_method::draft) mirrors += t.max_sequences;
    if (mirrors > d.max_sequences) {
      runtime::logger().info("serve: draft '{}' runs up to {} sequences, one for each of its targets' (it was given {})", d.name, mirrors,
                             d.max_sequences);
      d.max_sequences = mirrors;
    }
  }
  // Every model opened first: the arbiter's allocation unit follows their KV blocks.
  std::vector<uint64_t> per_token(roster_.models.size());
  for (size_t i = 0; i < roster_.models.size(); ++i) {
    auto& e = roster_.models[i];
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
    const std::string jinja = m->model->file().get_string("tokenizer.chat_template").value_or("");
    m->chat = models::chat_template_from_jinja(jinja);
    if (!e.chat_template.empty()) {
      // A family named in the roster replaces the file's template.
      const auto k = models::parse_chat_template_name(e.chat_template);
      if (!k) throw std::runtime_error("model '" + e.name + "': unknown chat_template '" + e.chat_template + "'");
      if (*k != m->chat.kind) m->chat = {*k, std::string(models::family_default_system_prompt(*k)), nullptr};
    } else {
      // The file's own template, rendered as transformers renders it; one that does not parse
      // leaves the recognised family's built-in rendering.
      try {
        m->chat.program = models::compile_chat_template(jinja);
      } catch (const models::jinja::error& ex) {
        runtime::logger().warn("serve: model '{}': its chat template does not parse ({}); using the built-in {} format", e.name, ex.what(),
                               models::chat_template_name(m->chat.kind));
      }
    }
    // The roster may state sizes for `tandem sim`; say so when the file disagrees.
    if (e.size_bytes && std::abs(static_cast<double>(*e.size_bytes) - static_cast<double>(m->file_bytes)) > 0.05 * static_cast<double>(m->file_bytes))
      runtime::logger().warn("serve: model '{}' states size {} but {} is {}", e.name, format_byte_size(*e.size_bytes), e.file,
                             format_byte_size(m->file_bytes));
    per_token[i] = models::kv_bytes_per_token(m->model->config(), kv_type_of(e.kv_type));
    if (e.kv_bytes_per_token && *e.kv_bytes_per_token != per_token[i])
      runtime::logger().warn("serve: model '{}' states {} KV bytes per token; its file needs {}", e.name, *e.kv_bytes_per_token, per_token[i]);
    // The planner keeps room for a sequence's KV beside the weights it places: the file's figure.
    e.kv_bytes_per_token = per_token[i];
    if (e.context > m->model->config().n_ctx_train && m->model->config().n_ctx_train > 0)
      runtime::logger().warn("serve: model '{}' runs a context of {} beyond the {} it was trained with", e.name, e.context,
                             m->model->config().n_ctx_train);
    runtime::logger().info("serve: {} ({}, {} {}, {} x {} positions) opened in {:.0f} ms", e.name, e.file,
                           models::architecture_name(m->model->config().arch), format_byte_size(m->file_bytes), e.max_sequences, e.context,
                           std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    models_.push_back(std::move(m));
  }
  // A draft of another vocabulary proposes through text: both tokenizers must spell any text.
  for (const auto& m : models_) {
    const auto& e = *m->entry;
    if (e.speculate.method != configs::speculate_method::draft) continue;
    const served_model* d = find(e.draft);
    if (!d || same_vocabulary(*m->tokenizer, *d->tokenizer)) continue;
    for (const served_model* x : {static_cast<const served_model*>(m.get()), d})
      if (!x->tokenizer->encodes_any_text())
        throw std::runtime_error(roster_.source + ":" + std::to_string(e.line) + ": model '" + e.name + "': draft '" + e.draft +
                                 "' has another vocabulary, and the tokenizer of '" + x->name() +
                                 "' cannot spell every text (no byte tokens): it cannot be tokenized back");
  }
  // What `serve --check` checks, with the same messages, before anything is allocated.
  std::vector<model_needs> needs;
  for (const auto& m : models_) needs.push_back(needs_of(*m->entry, m->model.get(), kv_type_of(m->entry->kv_type)));
  const size_t unit = page_unit_of(needs);
  check_placement(roster_, needs, unit);
  arbiter_ = std::make_unique<memory::arbiter>(*backend_, memory::arbiter_config{dev.vram, dev.host, unit});

  std::vector<engine_model> ems;
  for (size_t i = 0; i < models_.size(); ++i) {
    served_model& m = *models_[i];
    const auto& e = *m.entry;
    // KV pages come from the device tier all models share, as sequences need them: context x
    // max_sequences (or kv_limit) is a ceiling; only the kv_reserve floor is taken now.
    const kv_shape ks = kv_shape_for(e, per_token[i], arbiter_->config().block_bytes);
    memory::status st = memory::status::ok;
    m.kv = memory::kv_pool::make_elastic(*arbiter_, e.name, ks.limit_blocks, ks.reserve_blocks, k_block_tokens, static_cast<size_t>(ks.block_bytes),
                                         &st);
    if (!m.kv)
      throw std::runtime_error("model '" + e.name + "' (line " + std::to_string(e.line) + "): its kv_reserve of " +
                               format_byte_size(static_cast<uint64_t>(ks.reserve_blocks) * ks.page_bytes) +
                               " does not fit beside the others in the device budget of " + format_byte_size(dev.vram));
    m.placement = std::make_unique<models::arbiter_residency>(*arbiter_, *m.model, e.name);
    if (e.preload != configs::preload_tier::none) apply_memory_action(*m.placement, {policy::action_kind::stage, e.name, "preload", 0});
    if (e.preload == configs::preload_tier::device || e.pinned) apply_memory_action(*m.placement, {policy::action_kind::load, e.name, "preload", 0});
    engine_model em;
    em.name = e.name;
    em.model = m.model.get();
    em.tokenizer = m.tokenizer.get();
    em.priority = e.priority;
    em.max_sequences = e.max_sequences;
    em.context = e.context;
    em.kv = kv_type_of(e.kv_type);
    em.kv_rotate = kv_rotate_of(e);
    em.kv_pool = m.kv.get();
    em.placement = m.placement.get();
    em.max_queue = roster_.server.limits.max_queue;
    em.speculate = {spec_method_of(e.speculate.method), e.speculate.max_tokens, e.speculate.cache};
    if (e.speculate.method == configs::speculate_method::draft) em.draft = e.draft;
    ems.push_back(em);
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
