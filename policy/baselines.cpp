#include "policy/baselines.h"

#include <algorithm>
#include <vector>

namespace tandem::policy {
namespace {

struct view {
  const configs::model_entry* e;
  model_state st;
  const model_demand* dem;
  int queued() const { return dem ? dem->queued : 0; }
  bool busy() const { return st.running > 0 || queued() > 0; }
  // Weights and KV allocated up front for the whole context of one sequence (Ollama's default
  // OLLAMA_NUM_PARALLEL is 1; a static split reserves the same).
  uint64_t full_need() const { return st.weight_bytes + (e->kv_bytes_per_token ? *e->kv_bytes_per_token * static_cast<uint64_t>(e->context) : 0); }
};

std::vector<view> join(const configs::roster& r, const snapshot& s, const demand& d) {
  std::vector<view> v;
  for (const auto& entry : r.models) {
    const auto it = std::find_if(s.models.begin(), s.models.end(), [&](const model_state& x) { return x.name == entry.name; });
    if (it == s.models.end()) continue;
    const auto dt = std::find_if(d.models.begin(), d.models.end(), [&](const model_demand& x) { return x.name == entry.name; });
    v.push_back({&entry, *it, dt == d.models.end() ? nullptr : &*dt});
  }
  return v;
}

uint64_t used(const std::vector<view>& v, const snapshot& s) {
  uint64_t u = s.device_other;
  for (const auto& x : v) u += x.st.on_device ? x.full_need() : 0;
  return u;
}

// First come, first served: the waiting model with the oldest request (ties by roster order).
const view* oldest_waiting(const std::vector<view>& v) {
  const view* best = nullptr;
  for (const auto& x : v)
    if (x.queued() > 0 && (!best || x.dem->oldest < best->dem->oldest)) best = &x;
  return best;
}

std::string run_fcfs(const std::vector<view>& v) {
  const view* best = nullptr;
  for (const auto& x : v) {
    if (!x.st.on_device || !x.busy()) continue;
    if (!best || (x.queued() > 0 && (best->queued() == 0 || x.dem->oldest < best->dem->oldest))) best = &x;
  }
  return best ? best->st.name : "";
}

// Idle models whose keep_alive (a process's ttl) has run out leave the device.
void expire_idle(std::vector<view>& v, time_point now, const char* why, plan& p) {
  for (auto& x : v)
    if (x.st.on_device && !x.busy() && !x.e->keep_alive.forever && now - x.st.last_used >= x.e->keep_alive.after) {
      p.actions.push_back({action_kind::evict_device, x.st.name, why});
      x.st.on_device = false;
    }
}

}  // namespace

plan plan_exclusive(const configs::roster& r, const snapshot& s, const demand& d, time_point now) {
  auto v = join(r, s, d);
  plan p;
  expire_idle(v, now, "ttl expired", p);  // the process is stopped
  const view* want = oldest_waiting(v);
  // A swap waits for the running process's requests to finish (llama-swap drains in-flight).
  const bool draining = std::any_of(v.begin(), v.end(), [](const view& x) { return x.st.on_device && x.st.running > 0; });
  if (want && !want->st.on_device && !draining) {
    // Swap: stop every other process, start the wanted one (from disk).
    for (auto& x : v)
      if (x.st.on_device) {
        p.actions.push_back({action_kind::evict_device, x.st.name, "swap to " + want->st.name});
        x.st.on_device = false;
      }
    p.actions.push_back({action_kind::load, want->st.name, "swap"});
    const_cast<view*>(want)->st.on_device = true;
  }
  p.run = run_fcfs(v);
  return p;
}

plan plan_lru_keepalive(const configs::roster& r, const snapshot& s, const demand& d, time_point now) {
  auto v = join(r, s, d);
  plan p;
  expire_idle(v, now, "keep_alive expired", p);
  // Requests in arrival order; each model must fit whole.
  std::vector<view*> waiting;
  for (auto& x : v)
    if (x.queued() > 0 && !x.st.on_device) waiting.push_back(&x);
  std::sort(waiting.begin(), waiting.end(), [](const view* a, const view* b) { return a->dem->oldest < b->dem->oldest; });
  for (view* w : waiting) {
    const uint64_t need = w->full_need();
    std::vector<view*> idle;
    for (auto& x : v)
      if (x.st.on_device && !x.busy()) idle.push_back(&x);
    // Shortest keep_alive first (forever last), then least recently used.
    std::sort(idle.begin(), idle.end(), [](const view* a, const view* b) {
      const auto ka = a->e->keep_alive.forever ? configs::duration::max() : a->e->keep_alive.after;
      const auto kb = b->e->keep_alive.forever ? configs::duration::max() : b->e->keep_alive.after;
      if (ka != kb) return ka < kb;
      return a->st.last_used < b->st.last_used;
    });
    uint64_t free = s.device_capacity > used(v, s) ? s.device_capacity - used(v, s) : 0;
    std::vector<view*> chosen;
    for (view* x : idle) {
      if (free >= need) break;
      chosen.push_back(x);
      free += x->full_need();
    }
    if (free < need) break;  // the head of the queue waits for busy models to drain
    for (view* x : chosen) {
      p.actions.push_back({action_kind::evict_device, x->st.name, "make room for " + w->st.name});
      x->st.on_device = false;
    }
    p.actions.push_back({action_kind::load, w->st.name, "requested"});
    w->st.on_device = true;
  }
  p.run = run_fcfs(v);
  return p;
}

plan plan_static(const configs::roster& r, const snapshot& s, const demand& d, time_point /*now*/) {
  auto v = join(r, s, d);
  plan p;
  // The partition: by priority (ties in roster order) while the models fit whole.
  std::vector<view*> order;
  for (auto& x : v) order.push_back(&x);
  std::stable_sort(order.begin(), order.end(), [](const view* a, const view* b) { return a->e->priority > b->e->priority; });
  uint64_t budget = s.device_capacity > s.device_other ? s.device_capacity - s.device_other : 0;
  for (view* x : order) {
    if (x->full_need() > budget) continue;
    budget -= x->full_need();
    if (!x->st.on_device) {
      p.actions.push_back({action_kind::load, x->st.name, "static partition"});
      x->st.on_device = true;
    }
  }
  p.run = run_fcfs(v);
  return p;
}

}  // namespace tandem::policy
