#include "runtime/placement.h"

#include <algorithm>
#include <stdexcept>

#include "configs/byte_size.h"
#include "models/weight_plan.h"

namespace tandem::runtime {

using configs::format_byte_size;

placed_model::~placed_model() {
  // The pool, the scratch and the residency hand their memory back to the arbiter, which waits
  // for its copies before the backend goes.
  if (scratch) arbiter->release(*scratch);
  kv.reset();
  residency.reset();
  arbiter.reset();
  backend.reset();
}

std::unique_ptr<placed_model> place_model(const models::model& m, const std::string& name, const placement_options& o) {
  auto p = std::make_unique<placed_model>();
  const auto& plan = m.plan();
  const auto& c = m.config();
  p->backend = memory::make_backend(o.backend);
  // A GPU's memory is computed by the CUDA forward pass, which reads the file layout and
  // takes its own activations from the arbiter; the CPU kernels read the device tier directly.
  const bool gpu = !p->backend->device_host_addressable();
  if (gpu && m.options().pack_weights)
    throw std::runtime_error("backend " + p->backend->info().name +
                             ": the model must be loaded unpacked (pack_weights off) for the CUDA forward pass");
  p->arbiter = std::make_unique<memory::arbiter>(*p->backend, memory::arbiter_config{o.device_bytes, o.host_bytes});
  auto& a = *p->arbiter;
  p->residency = std::make_unique<models::arbiter_residency>(a, m, name, o.prefetch_depth);
  const memory::model_id id = p->residency->id();
  p->segments = plan.last_segment() + 1;

  // The KV cache first: the kernels read it only from the device, so it cannot be streamed.
  const auto bt = o.kv_block_tokens;
  const auto blocks = static_cast<int32_t>(o.n_seq * ((o.n_ctx + bt - 1) / bt));
  const auto block_bytes = static_cast<size_t>(models::kv_bytes_per_token(c, o.kv) * static_cast<uint64_t>(bt));
  memory::status st = memory::status::ok;
  p->kv = memory::kv_pool::make(a, name, blocks, bt, block_bytes, &st);
  const uint64_t kv_bytes = static_cast<uint64_t>(blocks) * block_bytes;
  if (!p->kv)
    throw std::runtime_error("the KV cache of " + name + " (" + std::to_string(o.n_seq) + " x " + std::to_string(o.n_ctx) + " positions) needs " +
                             format_byte_size(kv_bytes) + " of device memory; the device budget is " + format_byte_size(o.device_bytes));
  // The activations the forward pass writes, as a GPU's would be, in the device tier (the
  // CUDA pass allocates its own there).
  const uint64_t scratch = gpu ? 0 : models::forward_context::scratch_bytes(c, placed_context(*p, o));
  if (!gpu) p->scratch = a.allocate(memory::tier::device, static_cast<size_t>(scratch), {memory::owner_kind::scratch, name, "activations"});
  if (!gpu && !p->scratch)
    throw std::runtime_error("the activation scratch of " + name + " (" + std::to_string(o.max_batch) + " rows) needs " + format_byte_size(scratch) +
                             " of device memory besides the KV cache of " + format_byte_size(kv_bytes) + "; the device budget is " +
                             format_byte_size(o.device_bytes));

  // Host copies of as many segments as fit, in order, so swap-ins and streaming copy from RAM.
  std::vector<memory::event> copies;
  for (int s = 0; s <= plan.last_segment(); ++s) {
    const auto r = a.stage(id, {s, 1});
    if (r.st != memory::status::ok) break;
    copies.push_back(r.done);
    ++p->staged;
  }

  // Every segment on the device if they fit (all or nothing), else streaming.
  const uint64_t weights = plan.total_bytes();
  if (const auto all = a.load(id); all.st == memory::status::ok) {
    copies.push_back(all.done);
    p->on_device = p->segments;
  } else {
    if (!o.allow_streaming)
      throw std::runtime_error("the weights of " + name + " need " + format_byte_size(weights) + " of device memory and its KV cache " +
                               format_byte_size(kv_bytes) + ", more than the device budget of " + format_byte_size(o.device_bytes) +
                               " (host budget " + format_byte_size(o.host_bytes) + "); raise the device budget or allow streaming");
    // Slots for the prefetch depth asked for, or fewer down to one.
    int slots = o.prefetch_depth + 1;
    while (slots > 0 && a.reserve_stream_slots(id, slots) != memory::status::ok) --slots;
    if (slots == 0)
      throw std::runtime_error("streaming " + name + " needs one stream slot of " + format_byte_size(plan.largest_segment()) +
                               " (its largest segment) besides the KV cache of " + format_byte_size(kv_bytes) + " and the activation scratch of " +
                               format_byte_size(scratch) + "; the device budget is " + format_byte_size(o.device_bytes));
    p->stream_slots = slots;
    for (int s = 0; s <= plan.last_segment(); ++s) {
      const auto r = a.load(id, {s, 1});
      if (r.st != memory::status::ok) continue;  // a smaller one further on may still fit
      copies.push_back(r.done);
      ++p->on_device;
    }
  }
  p->loaded = memory::all_of(std::move(copies));
  if (o.wait) p->loaded.wait();
  return p;
}

models::context_params placed_context(const placed_model& p, const placement_options& o) {
  models::context_params cp;
  cp.n_ctx = o.n_ctx;
  cp.kv = o.kv;
  cp.kv_rotate = o.kv_rotate;
  cp.n_seq = o.n_seq;
  cp.max_batch = o.max_batch;
  cp.kv_pool = p.kv.get();
  cp.scratch = p.scratch ? p.scratch->data : nullptr;
  return cp;
}

}  // namespace tandem::runtime
