#include "runtime/roster_check.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "configs/byte_size.h"
#include "models/forward.h"
#include "models/weight_plan.h"
#include "runtime/served_roster.h"

namespace tandem::runtime {

namespace {

uint64_t whole(uint64_t bytes, size_t unit) { return (bytes + unit - 1) / unit * unit; }

// The prefetch depth serve's placements stream with (models::arbiter_residency's default).
constexpr int k_prefetch_depth = 2;

}  // namespace

model_needs needs_of(const configs::model_entry& e, const models::model* m, kernels::cpu::kv_type kv) {
  model_needs n;
  n.entry = &e;
  if (m) {
    if (const std::string why = models::kv_type_problem(m->config(), kv, kv_rotate_of(e)); !why.empty())
      throw std::runtime_error("model '" + e.name + "' (line " + std::to_string(e.line) + "): kv_type " + kernels::cpu::kv_type_name(kv) +
                               (kv_rotate_of(e) ? ", rotated" : "") + ": " + why);
    n.from_file = true;
    for (const auto& s : m->plan().segments) {
      n.weight_bytes += s.bytes;
      n.largest_segment = std::max<uint64_t>(n.largest_segment, s.bytes);
    }
    n.kv_bytes_per_token = models::kv_bytes_per_token(m->config(), kv);
    return n;
  }
  n.weight_bytes = n.largest_segment = e.size_bytes.value_or(0);
  n.kv_bytes_per_token = e.kv_bytes_per_token.value_or(0);
  return n;
}

size_t page_unit_of(std::span<const model_needs> needs) {
  std::vector<uint64_t> blocks;
  for (const auto& n : needs)
    if (n.kv_bytes_per_token > 0) blocks.push_back(n.kv_bytes_per_token * static_cast<uint64_t>(configs::k_kv_block_tokens));
  return kv_page_unit(blocks);
}

void check_placement(const configs::roster& r, std::span<const model_needs> needs, size_t unit) {
  using configs::format_byte_size;
  const auto& dev = r.devices.front();
  const uint64_t vram = dev.vram / unit * unit;  // whole units, as the arbiter's pool
  auto where = [](const configs::model_entry& e) { return "model '" + e.name + "' (line " + std::to_string(e.line) + ")"; };

  // KV floors are taken at start, and what is pinned or preloaded to the device lands beside them.
  uint64_t floors = 0, placed = 0;
  std::vector<kv_shape> shapes;
  for (const auto& n : needs) {
    shapes.push_back(kv_shape_for(*n.entry, n.kv_bytes_per_token, unit));
    const uint64_t most = static_cast<uint64_t>(shapes.back().limit_blocks) * shapes.back().page_bytes;
    if (n.entry->kv_reserve > most)
      throw std::runtime_error(
          where(*n.entry) + ": kv_reserve " + format_byte_size(n.entry->kv_reserve) + " is more than it can hold (" +
          (n.entry->kv_limit ? "kv_limit" : std::to_string(n.entry->max_sequences) + " x " + std::to_string(n.entry->context) + " positions") + ": " +
          format_byte_size(most) + ")");
    floors += static_cast<uint64_t>(shapes.back().reserve_blocks) * shapes.back().page_bytes;
    if (n.entry->pinned || n.entry->preload == configs::preload_tier::device) placed += whole(n.weight_bytes, unit);
  }
  if (floors > vram)
    throw std::runtime_error(r.source + ": the KV floors (kv_reserve) need " + format_byte_size(floors) + ", more than the device budget of " +
                             format_byte_size(dev.vram));
  if (floors + placed > vram)
    throw std::runtime_error(r.source + ": the models pinned or preloaded to the device need " + format_byte_size(placed) + " beside " +
                             format_byte_size(floors) + " of KV floors (kv_reserve), more than the device budget of " + format_byte_size(dev.vram));
  // Each model alone: its weights (or, streamed, its stream slots and half its weights, as the
  // planner places it) and one KV page beside every floor.
  for (size_t i = 0; i < needs.size(); ++i) {
    const auto& n = needs[i];
    const uint64_t weights = whole(n.weight_bytes, unit);
    const uint64_t slots = static_cast<uint64_t>(k_prefetch_depth + 1) * whole(n.largest_segment, unit);
    const uint64_t need = r.policy.stream ? std::min(weights, std::max(slots, weights / 2)) : weights;
    const uint64_t page = shapes[i].reserve_blocks > 0 ? 0 : shapes[i].page_bytes;
    if (floors + need + page > vram)
      throw std::runtime_error(where(*n.entry) + " cannot run on a device budget of " + format_byte_size(dev.vram) + ": it needs " +
                               format_byte_size(need) + (need < weights ? " of stream slots and weights" : " of weights") + " and a KV page beside " +
                               format_byte_size(floors) + " of KV floors (kv_reserve)");
  }
}

int32_t kv_pages_beside_weights(const configs::roster& r, std::span<const model_needs> needs, size_t unit, size_t i) {
  const uint64_t vram = r.devices.front().vram / unit * unit;
  uint64_t taken = whole(needs[i].weight_bytes, unit);
  for (size_t j = 0; j < needs.size(); ++j) {
    if (j == i) continue;
    const auto ks = kv_shape_for(*needs[j].entry, needs[j].kv_bytes_per_token, unit);
    taken += static_cast<uint64_t>(ks.reserve_blocks) * ks.page_bytes;
    if (needs[j].entry->pinned) taken += whole(needs[j].weight_bytes, unit);
  }
  if (taken >= vram) return 0;
  const auto own = kv_shape_for(*needs[i].entry, needs[i].kv_bytes_per_token, unit);
  return static_cast<int32_t>(std::min<uint64_t>((vram - taken) / own.page_bytes, static_cast<uint64_t>(own.limit_blocks)));
}

}  // namespace tandem::runtime
