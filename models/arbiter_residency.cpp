#include "models/arbiter_residency.h"

#include <stdexcept>
#include <utility>

#include "models/weight_plan.h"

namespace tandem::models {

std::vector<memory::segment_source> segment_sources(const model& m) {
  std::vector<memory::segment_source> out;
  for (const auto& s : m.plan().segments) {
    const segment_layout* layout = &s;
    out.push_back({s.name, s.bytes, [layout](std::byte* dst) { fill_segment(*layout, dst); }});
  }
  return out;
}

namespace {
int checked_depth(int d) {
  if (d < 0) throw std::invalid_argument("prefetch depth must be >= 0, got " + std::to_string(d));
  return d;
}
}  // namespace

arbiter_residency::arbiter_residency(memory::arbiter& a, const model& m, std::string name, int prefetch_depth)
    : a_(a), depth_(checked_depth(prefetch_depth)), id_(a.add_model(std::move(name), segment_sources(m))) {
  leases_.resize(m.plan().segments.size());
  holds_.assign(m.plan().segments.size(), 0);
}

arbiter_residency::~arbiter_residency() {
  leases_.clear();
  a_.remove_model(id_);
}

memory::status arbiter_residency::prepare_streaming() {
  const int n = a_.segment_count(id_);
  for (int s = 0; s < n; ++s)
    if (a_.residency_of(id_, s, memory::tier::device) == memory::residency::absent) return a_.reserve_stream_slots(id_, depth_ + 1);
  return memory::status::ok;
}

const std::byte* arbiter_residency::acquire(int seg) {
  auto& h = holds_.at(static_cast<size_t>(seg));
  if (h == 0) {
    leases_[static_cast<size_t>(seg)] = a_.acquire(id_, seg, nullptr, stream_);  // may throw: nothing counted yet
    if (!leases_[static_cast<size_t>(seg)]) return nullptr;
  }
  ++h;
  return leases_[static_cast<size_t>(seg)].data();
}

void arbiter_residency::release(int seg) {
  auto& h = holds_.at(static_cast<size_t>(seg));
  if (h > 0 && --h == 0) leases_[static_cast<size_t>(seg)].reset();
}

bool arbiter_residency::hold_all() {
  if (whole_) return true;
  const int n = static_cast<int>(leases_.size());
  for (int s = 0; s < n; ++s)
    if (a_.residency_of(id_, s, memory::tier::device) != memory::residency::resident) return false;
  int held = 0;
  for (; held < n; ++held)
    if (!acquire(held)) break;  // (resident a moment ago: only a concurrent eviction says no)
  if (held < n) {
    for (int s = 0; s < held; ++s) release(s);
    return false;
  }
  whole_ = true;
  return true;
}

void arbiter_residency::release_all() {
  if (!std::exchange(whole_, false)) return;
  for (int s = 0; s < static_cast<int>(leases_.size()); ++s) release(s);
}

void arbiter_residency::prefetch(int seg) {
  if (seg >= 0 && seg < static_cast<int>(leases_.size())) a_.prefetch(id_, seg);
}

}  // namespace tandem::models
