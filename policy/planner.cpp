#include "policy/planner.h"

#include <algorithm>
#include <limits>
#include <map>

#include "policy/baselines.h"

namespace tandem::policy {

const char* action_name(action_kind k) {
  switch (k) {
    case action_kind::stage:
      return "stage";
    case action_kind::load:
      return "load";
    case action_kind::evict_device:
      return "evict-device";
    case action_kind::evict_host:
      return "evict-host";
    case action_kind::preempt:
      return "preempt";
    case action_kind::resume:
      return "resume";
  }
  return "?";
}

namespace {

double seconds(std::chrono::nanoseconds d) { return std::chrono::duration<double>(d).count(); }

// A draft pays when its target's sequences gain at least this much per unit of time.
constexpr double k_draft_pays = 1.05;

// The planner's working copy of the world: what each action would change, so later rules see
// the effect of earlier ones.
struct world {
  const configs::roster& r;
  const snapshot& s;
  const demand& d;
  time_point now;
  std::vector<model_state> m;  // snapshot models that are in the roster, in roster order
  std::vector<const configs::model_entry*> e;
  std::vector<const model_demand*> dem;
  std::vector<bool> brought;  // loaded by this plan: never also a victim in it
  plan out;

  world(const configs::roster& r_, const snapshot& s_, const demand& d_, time_point n) : r(r_), s(s_), d(d_), now(n) {
    for (const auto& entry : r.models) {
      const auto it = std::find_if(s.models.begin(), s.models.end(), [&](const model_state& x) { return x.name == entry.name; });
      if (it == s.models.end()) continue;
      m.push_back(*it);
      e.push_back(&entry);
      const auto dt = std::find_if(d.models.begin(), d.models.end(), [&](const model_demand& x) { return x.name == entry.name; });
      dem.push_back(dt == d.models.end() ? nullptr : &*dt);
    }
    brought.assign(m.size(), false);
  }
  size_t size() const { return m.size(); }
  int queued(size_t i) const { return dem[i] ? dem[i]->queued : 0; }
  // Waiting work it could start now: a preempted sequence, or a request with a free sequence
  // slot. Only that ages and counts as first-token work: a model whose slots are all busy
  // cannot use the device for its queue, and must not take the device from others for it.
  bool startable(size_t i) const { return m[i].preempted > 0 || (queued(i) > 0 && m[i].running < e[i]->max_sequences); }
  bool wanted(size_t i) const { return queued(i) > 0 || m[i].preempted > 0; }
  bool busy(size_t i) const { return m[i].running > 0 || queued(i) > 0; }
  // A draft with no work of its own: it only speculates, and is the first to give way.
  bool idle_draft(size_t i) const { return e[i]->role == configs::model_role::draft && !busy(i) && m[i].preempted == 0; }
  size_t index_of(const std::string& name) const {
    for (size_t i = 0; i < size(); ++i)
      if (m[i].name == name) return i;
    return size();
  }
  double prio(size_t i) const { return startable(i) ? effective_priority(r, *e[i], dem[i], now) : e[i]->priority; }
  uint64_t device_used() const {
    uint64_t u = s.device_other;
    for (const auto& x : m) u += resident_bytes(x) + x.kv_device_bytes;
    return u;
  }
  uint64_t device_free() const { return s.device_capacity > device_used() ? s.device_capacity - device_used() : 0; }
  uint64_t host_used() const {
    uint64_t u = 0;
    for (const auto& x : m) u += x.on_host ? x.weight_bytes : 0;
    return u;
  }
  uint64_t host_free() const { return s.host_capacity > host_used() ? s.host_capacity - host_used() : 0; }
  // Bytes a model needs on the device to start: its weights and one sequence's KV.
  uint64_t need(size_t i) const {
    return m[i].weight_bytes + (e[i]->kv_bytes_per_token ? *e[i]->kv_bytes_per_token * static_cast<uint64_t>(e[i]->context) : 0);
  }
  void act(action_kind k, size_t i, std::string why) { out.actions.push_back({k, m[i].name, std::move(why)}); }

  void evict(size_t i, const std::string& why) {
    if (m[i].running > 0) {
      act(action_kind::preempt, i, why);
      m[i].preempted += m[i].running;
      m[i].running = 0;
    }
    m[i].kv_device_bytes = 0;  // its sequences' and cached prefixes' KV leaves with it
    act(action_kind::evict_device, i, why);
    m[i].on_device = false;
  }
  // Loads model i, wholly (bytes 0) or its first `bytes` of weights, the rest to be streamed.
  void bring(size_t i, const std::string& why, uint64_t bytes = 0) {
    // Staged first where the host has room: the next swap-in (and streaming) copies from RAM.
    if (!m[i].on_host && host_free() >= m[i].weight_bytes) {
      act(action_kind::stage, i, why);
      m[i].on_host = true;
    }
    out.actions.push_back({action_kind::load, m[i].name, why, bytes});
    brought[i] = true;
    if (!m[i].on_device) m[i].loaded_at = now;
    m[i].on_device = true;
    m[i].device_bytes = bytes;
  }
  bool partial(size_t i) const { return m[i].on_device && resident_bytes(m[i]) < m[i].weight_bytes; }
  bool protected_by_hysteresis(size_t victim, size_t for_model) const {
    return now - m[victim].loaded_at < r.policy.hysteresis && e[for_model]->priority <= e[victim]->priority;
  }

  // Frees room for model `i` among models the predicate allows, cheapest victims first; with
  // `preempt`, running ones too. Returns whether `need` now fits; evicts nothing if it cannot.
  // any_priority: victims need not rank below `i` and hysteresis does not protect them (for a
  // pinned model).
  // by_base: rank by base priority, aged only among equals (see plan_tandem: aging has a model
  // that can stream served beside a higher-priority one, so it does not take the device from
  // it in the middle of its burst, nor hold it off).
  bool make_room(size_t i, uint64_t need_bytes, bool allow_preempt, const std::string& why, bool any_priority = false, bool by_base = false) {
    if (device_free() >= need_bytes) return true;
    const double pi = prio(i);
    std::vector<size_t> idle, running;
    for (size_t v = 0; v < size(); ++v) {
      if (v == i || !m[v].on_device || e[v]->pinned || brought[v]) continue;
      // A model ranking at or above `i` gives way only once idle for policy.idle_grace: between
      // its bursts, not within one. by_base: ranked by base priority, aged only among equals.
      const bool idle_long = !busy(v) && m[v].preempted == 0 && now - m[v].last_used >= r.policy.idle_grace;
      const bool ranks_above = by_base && e[v]->priority != e[i]->priority ? e[v]->priority > e[i]->priority : prio(v) >= pi;
      if (!any_priority && !idle_draft(v) && ((ranks_above && !idle_long) || protected_by_hysteresis(v, i))) continue;
      (busy(v) ? running : idle).push_back(v);
    }
    auto by_score = [&](size_t a, size_t b) {
      if (idle_draft(a) != idle_draft(b)) return idle_draft(a);  // speculation stops before anything else moves
      const double sa = victim_score(*e[a], m[a], s, now), sb = victim_score(*e[b], m[b], s, now);
      return sa != sb ? sa < sb : m[a].name < m[b].name;
    };
    std::sort(idle.begin(), idle.end(), by_score);
    std::sort(running.begin(), running.end(), by_score);
    std::vector<size_t> chosen;
    uint64_t freed = device_free();
    for (const size_t v : idle) {
      if (freed >= need_bytes) break;
      chosen.push_back(v);
      freed += resident_bytes(m[v]) + m[v].kv_device_bytes;
    }
    if (allow_preempt)
      for (const size_t v : running) {
        if (freed >= need_bytes) break;
        chosen.push_back(v);
        freed += resident_bytes(m[v]) + m[v].kv_device_bytes;
      }
    if (freed < need_bytes) return false;
    for (const size_t v : chosen) evict(v, why);
    return true;
  }
};

}  // namespace

double effective_priority(const configs::roster& r, const configs::model_entry& m, const model_demand* d, time_point now) {
  double p = m.priority;
  if (d && d->oldest != time_point{} && now > d->oldest) {
    int top = 0;
    for (const auto& x : r.models) top = std::max(top, x.priority);
    const double wait = seconds(now - d->oldest), bound = std::max(1e-3, seconds(r.policy.max_wait));
    // Linear in the wait: after max_wait it is above the roster's highest priority.
    p += wait / bound * (top + 1);
  }
  return p;
}

bool may_interleave(const configs::roster& r, const configs::model_entry& outer, const configs::model_entry& inner, std::chrono::nanoseconds paused) {
  return r.policy.name == "tandem" && r.policy.interleave && inner.priority > outer.priority && paused < r.policy.max_wait;
}

double victim_score(const configs::model_entry& m, const model_state& st, const snapshot& s, time_point now) {
  // Seconds to bring it back (from host at link speed, else from disk too), weighted by its
  // priority, per GB it frees, and discounted the longer it has been idle.
  const double gb = static_cast<double>(st.weight_bytes + st.kv_device_bytes) / 1e9;
  const double reload = static_cast<double>(st.weight_bytes) / 1e9 / std::max(1e-3, s.link_gb_s) +
                        (st.on_host ? 0.0 : static_cast<double>(st.weight_bytes) / 1e9 / std::max(1e-3, s.disk_gb_s));
  const double idle_min = std::max(0.0, seconds(now - st.last_used)) / 60.0;
  return (m.priority + 1.0) * reload / std::max(gb, 1e-6) / (1.0 + idle_min);
}

plan make_plan(const configs::roster& r, const snapshot& s, const demand& d, time_point now) {
  const auto& name = r.policy.name;
  if (name == "exclusive") return plan_exclusive(r, s, d, now);
  if (name == "lru-keepalive") return plan_lru_keepalive(r, s, d, now);
  if (name == "static") return plan_static(r, s, d, now);
  return plan_tandem(r, s, d, now);
}

plan plan_tandem(const configs::roster& r, const snapshot& s, const demand& d, time_point now) {
  world w(r, s, d, now);
  const size_t n = w.size();

  // 1. Pinned models on the device, whatever it takes.
  for (size_t i = 0; i < n; ++i)
    if (w.e[i]->pinned && !w.m[i].on_device && w.make_room(i, w.need(i), true, "make room for pinned " + w.m[i].name, true)) w.bring(i, "pinned");

  // 2-4. Demanded models by effective priority.
  std::vector<size_t> order;
  for (size_t i = 0; i < n; ++i)
    if (w.wanted(i)) order.push_back(i);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    const double pa = w.prio(a), pb = w.prio(b);
    return pa != pb ? pa > pb : w.m[a].name < w.m[b].name;
  });
  for (const size_t i : order) {
    const std::string why = "demanded " + w.m[i].name;
    if (w.partial(i)) {
      // Streaming: the rest of it comes on as soon as room can be made without preempting, and
      // without evicting a model of higher base priority within its burst: aging has this
      // model served already (it runs), it must not also take the device.
      if (w.make_room(i, w.m[i].weight_bytes - resident_bytes(w.m[i]), false, why, false, true)) w.bring(i, "room for the rest");
      continue;
    }
    if (w.m[i].on_device) {
      // On the device but short of KV pages for its waiting work: room from others, by base
      // priority first, then by aged rank, then preempting (as for weights below).
      const uint64_t want = w.m[i].kv_wanted_bytes;
      if (want > w.device_free() && !w.make_room(i, want, false, why + " (KV)", false, true) && !w.make_room(i, want, false, why + " (KV)"))
        w.make_room(i, want, true, why + " (KV)");
      continue;
    }
    const uint64_t kv = w.need(i) - w.m[i].weight_bytes;
    const uint64_t at_least = kv + w.m[i].weight_bytes / 2;
    auto stream_beside = [&](bool by_base) {
      if (!r.policy.stream || !w.make_room(i, at_least, false, why, false, by_base)) return false;
      w.bring(i, "streamed beside higher-priority work", std::min(w.m[i].weight_bytes, w.device_free() - kv));
      return true;
    };
    // By base priority first: whole if room can be made from models below it (or idle long),
    // else streamed beside those above it. Aging has the model served either way, so its aged
    // rank does not evict a higher-priority model in the middle of a burst.
    // When streaming is on, models of lower base priority are preempted for it too: they can
    // come back streamed beside it, so their aged rank is honoured without holding it off.
    if (w.make_room(i, w.need(i), false, why, false, true) || (r.policy.stream && w.make_room(i, w.need(i), true, why, false, true))) {
      w.bring(i, "demanded");
      continue;
    }
    if (stream_beside(true)) continue;
    // Not even streamed: by aged rank, preempting if need be (the bounded wait of rule 3).
    if (w.make_room(i, w.need(i), false, why) || w.make_room(i, w.need(i), true, why)) {
      w.bring(i, "demanded");
      continue;
    }
    // No room without taking it from models that rank higher (busy, or idle only briefly):
    // run it streamed beside them, with the part that fits on the device and its KV.
    stream_beside(false);
  }

  // 2c. Drafts come with their targets: a target wholly on the device with work gets its draft
  // loaded where the free device memory holds it beside the KV the target wants (nothing is
  // evicted for a draft), unless the measured speed-up says it does not pay; one that does
  // not pay leaves the device once it has no work of its own.
  for (size_t i = 0; i < n; ++i) {
    if (w.e[i]->speculate.method != configs::speculate_method::draft) continue;
    const size_t j = w.index_of(w.e[i]->draft);
    if (j == n || !w.m[i].on_device || w.partial(i) || !w.busy(i)) continue;
    const double gain = w.dem[i] ? w.dem[i]->draft_speedup : 0;
    if (gain > 0 && gain < k_draft_pays) {
      if (w.m[j].on_device && w.idle_draft(j) && !w.e[j]->pinned) w.evict(j, "draft of " + w.m[i].name + " does not pay");
      continue;
    }
    if (!w.m[j].on_device && w.device_free() >= w.need(j) + w.m[i].kv_wanted_bytes) w.bring(j, "draft for " + w.m[i].name);
  }

  // 5. Keep-alive expiry.
  for (size_t i = 0; i < n; ++i) {
    const auto& ka = w.e[i]->keep_alive;
    if (!w.m[i].on_device || w.e[i]->pinned || w.busy(i) || w.m[i].preempted > 0 || ka.forever) continue;
    if (w.now - w.m[i].last_used >= ka.after) w.evict(i, "keep_alive " + configs::format_duration(ka.after) + " expired");
  }

  // 6. Home comes back once nothing else is asked for and the others have been idle a while.
  bool others_quiet = true, anything = false;
  size_t home = n;
  for (size_t i = 0; i < n; ++i) {
    if (w.m[i].name == r.policy.home) home = i;
    anything = anything || w.busy(i) || w.wanted(i);
  }
  if (home < n) {
    for (size_t i = 0; i < n; ++i)
      if (i != home && (w.busy(i) || w.wanted(i) || (w.m[i].on_device && w.now - w.m[i].last_used < r.policy.hysteresis))) others_quiet = false;
    if (!w.m[home].on_device && others_quiet) {
      // Room from idle models only (the home model's return never preempts).
      std::vector<size_t> idle;
      for (size_t v = 0; v < n; ++v)
        if (v != home && w.m[v].on_device && !w.e[v]->pinned) idle.push_back(v);
      std::sort(idle.begin(), idle.end(),
                [&](size_t a, size_t b) { return victim_score(*w.e[a], w.m[a], s, now) < victim_score(*w.e[b], w.m[b], s, now); });
      uint64_t freed = w.device_free();
      std::vector<size_t> chosen;
      for (const size_t v : idle) {
        if (freed >= w.need(home)) break;
        chosen.push_back(v);
        freed += resident_bytes(w.m[v]) + w.m[v].kv_device_bytes;
      }
      if (freed >= w.need(home)) {
        for (const size_t v : chosen) w.evict(v, "home " + w.m[home].name + " returns");
        w.bring(home, "home");
      }
    }
  }

  // 7. Prefetch when nothing is asked for: the likeliest next model, to host, and to the
  // device where it fits without evicting anything.
  if (!anything && r.policy.prefetch) {
    size_t best = n;
    for (size_t i = 0; i < n; ++i) {
      if (w.m[i].on_device || !w.dem[i] || w.dem[i]->arrivals_per_s <= 0) continue;
      if (best == n || w.dem[i]->arrivals_per_s > w.dem[best]->arrivals_per_s ||
          (w.dem[i]->arrivals_per_s == w.dem[best]->arrivals_per_s && w.e[i]->priority > w.e[best]->priority))
        best = i;
    }
    if (best < n) {
      if (!w.m[best].on_host && w.host_free() >= w.m[best].weight_bytes) {
        w.act(action_kind::stage, best, "prefetch");
        w.m[best].on_host = true;
      }
      if (w.device_free() >= w.need(best)) w.bring(best, "prefetch");
    }
  }

  // 8. Preempted sequences come back when their model is on the device.
  for (size_t i = 0; i < n; ++i)
    if (w.m[i].on_device && w.m[i].preempted > 0 && w.device_free() >= w.need(i) - w.m[i].weight_bytes) {
      w.act(action_kind::resume, i, "model on the device");
      w.m[i].running += w.m[i].preempted;
      w.m[i].preempted = 0;
    }

  // The model to step: on the device, highest effective priority, models with requests waiting
  // for their first token before models that only have tokens left to generate (time to first
  // token is what a person waits for; a running generation loses a step, not its start).
  for (const bool first_tokens : {true, false}) {
    double best = -1;
    for (size_t i = 0; i < n; ++i) {
      if (!w.m[i].on_device || !(first_tokens ? w.startable(i) : w.busy(i))) continue;
      const double p = w.prio(i);
      if (w.out.run.empty() || p > best || (p == best && w.m[i].name < w.out.run)) {
        best = p;
        w.out.run = w.m[i].name;
      }
    }
    if (!w.out.run.empty()) break;
  }
  return w.out;
}

}  // namespace tandem::policy
