#include "policy/sim.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>

#include "policy/planner.h"

namespace tandem::policy {
namespace {

// SplitMix64: a seeded stream of 64-bit values whose sequence is fixed by definition (the
// standard distributions are not specified bit for bit across library versions).
struct rng {
  uint64_t s;
  uint64_t next() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  double exponential(double mean) { return -mean * std::log(1.0 - uniform()); }
  int64_t between(int64_t lo, int64_t hi) { return lo + static_cast<int64_t>(next() % static_cast<uint64_t>(hi - lo + 1)); }
};

double secs(configs::duration d) { return std::chrono::duration<double>(d).count(); }

double percentile(const std::vector<double>& sorted_with_inf, double p) {
  if (sorted_with_inf.empty()) return 0;
  const auto n = sorted_with_inf.size();
  const size_t rank = static_cast<size_t>(std::ceil(p * static_cast<double>(n)));
  return sorted_with_inf[std::min(n, std::max<size_t>(rank, 1)) - 1];
}

struct req_state {
  const sim_request* r;
  int64_t prefilled = 0, generated = 0;
  double first_token = -1, done = -1;
};

struct model_sim {
  const configs::model_entry* e;
  const configs::model_costs* cost;
  uint64_t bytes = 0, kv_per_seq = 0;
  uint64_t device_bytes = 0;  // weights held on the device; the rest streams every step
  bool on_device = false, on_host = false;
  double device_ready = 0, host_ready = 0;
  double last_used = -1e9, loaded_at = -1e9;
  std::deque<size_t> queue;  // waiting to start
  std::vector<size_t> running, preempted;
  int swaps = 0;
  double gb = 0;
};

}  // namespace

std::vector<sim_request> expand_trace(const configs::trace_spec& t, uint64_t seed) {
  std::vector<sim_request> out;
  const double length = secs(t.length);
  for (const auto& st : t.streams) {
    rng g{seed * 0x100000001B3ull + st.seed};
    auto add = [&](double at) {
      out.push_back({at, st.model, g.between(st.prompt.min, st.prompt.max), g.between(st.output.min, st.output.max)});
    };
    if (!st.bursts) {
      for (double at = g.exponential(1 / st.rate_per_s); at < length; at += g.exponential(1 / st.rate_per_s)) add(at);
      continue;
    }
    // Off, then on, alternately, each of exponential length; Poisson arrivals while on.
    for (double at = g.exponential(secs(st.off)); at < length;) {
      const double end = at + g.exponential(secs(st.on));
      for (double a = at + g.exponential(1 / st.rate_per_s); a < std::min(end, length); a += g.exponential(1 / st.rate_per_s)) add(a);
      at = end + g.exponential(secs(st.off));
    }
  }
  for (const auto& e : t.requests) out.push_back({secs(e.at), e.model, e.prompt, e.output});
  std::stable_sort(out.begin(), out.end(), [](const sim_request& a, const sim_request& b) {
    return a.arrive != b.arrive ? a.arrive < b.arrive : a.model < b.model;
  });
  return out;
}

sim_result simulate(const configs::roster& r, const configs::trace_spec& t, const std::vector<sim_request>& requests) {
  const auto& c = t.costs;
  const bool process_per_model = r.policy.name == "exclusive" || r.policy.name == "lru-keepalive";
  const configs::device_config& dev = r.devices.front();
  std::vector<model_sim> ms;
  std::map<std::string, size_t> index;
  static const configs::model_costs k_none{};
  for (const auto& e : r.models) {
    model_sim m;
    m.e = &e;
    const auto it = c.models.find(e.name);
    m.cost = it == c.models.end() ? &k_none : &it->second;
    m.bytes = e.size_bytes.value_or(0);
    m.kv_per_seq = e.kv_bytes_per_token.value_or(0) * static_cast<uint64_t>(e.context);
    index[e.name] = ms.size();
    ms.push_back(m);
  }
  std::vector<req_state> rs;
  for (const auto& q : requests) rs.push_back({&q});

  const policy::time_point base = policy::time_point{} + std::chrono::hours(24);
  auto at = [&](double s) { return base + std::chrono::duration_cast<policy::clock::duration>(std::chrono::duration<double>(s)); };
  double now = 0, device_free = 0, link_free = 0, disk_free = 0, busy = 0;
  size_t next_arrival = 0, finished = 0;
  // Arrival counts per model over the last minute, for the planner's prefetching.
  const double horizon = secs(t.length) + 3600;  // an hour to drain after the trace ends

  while (finished < rs.size() && now <= horizon) {
    while (next_arrival < rs.size() && rs[next_arrival].r->arrive <= now) {
      const auto it = index.find(rs[next_arrival].r->model);
      if (it != index.end()) ms[it->second].queue.push_back(next_arrival);
      else ++finished;  // a model the roster does not have: dropped (the loader refuses such traces)
      ++next_arrival;
    }
    double wake = next_arrival < rs.size() ? rs[next_arrival].r->arrive : std::numeric_limits<double>::infinity();
    if (device_free <= now) {
      // The planner's view of the simulated world.
      snapshot s;
      s.device_capacity = dev.vram;
      s.host_capacity = dev.host;
      s.link_gb_s = c.link_gb_s;
      s.disk_gb_s = c.disk_gb_s;
      demand d;
      for (auto& m : ms) {
        model_state st;
        st.name = m.e->name;
        st.weight_bytes = m.bytes;
        st.on_device = m.on_device;
        st.device_bytes = m.on_device ? m.device_bytes : 0;
        st.on_host = m.on_host;
        // Paged KV: a running sequence holds the blocks of the tokens it has so far.
        uint64_t kv_tokens = 0;
        for (const size_t k : m.running) kv_tokens += static_cast<uint64_t>(rs[k].prefilled + rs[k].generated);
        st.kv_device_bytes = kv_tokens * m.e->kv_bytes_per_token.value_or(0);
        st.running = static_cast<int>(m.running.size());
        st.preempted = static_cast<int>(m.preempted.size());
        st.last_used = at(m.last_used);
        st.loaded_at = at(m.loaded_at);
        s.models.push_back(st);
        model_demand md;
        md.name = m.e->name;
        // Preempted sequences wait too: they age from their arrival like queued ones.
        md.queued = static_cast<int>(m.queue.size() + m.preempted.size());
        double oldest = now;
        if (!m.queue.empty()) oldest = std::min(oldest, rs[m.queue.front()].r->arrive);
        for (const size_t k : m.preempted) oldest = std::min(oldest, rs[k].r->arrive);
        md.oldest = at(oldest);
        int recent = 0;
        for (size_t k = next_arrival; k-- > 0 && rs[k].r->arrive > now - 600;)
          if (rs[k].r->model == m.e->name) ++recent;
        md.arrivals_per_s = recent / 600.0;
        d.models.push_back(md);
      }
      const plan p = make_plan(r, s, d, at(now));
      for (const auto& a : p.actions) {
        model_sim& m = ms[index.at(a.model)];
        const double gb = static_cast<double>(m.bytes) / 1e9;
        switch (a.kind) {
          case action_kind::evict_device:
            if (!m.running.empty()) break;  // only the planner's preempt takes running work away
            m.on_device = false;
            m.device_bytes = 0;
            break;
          case action_kind::evict_host: m.on_host = false; break;
          case action_kind::stage:
            m.on_host = true;
            disk_free = std::max(now, disk_free) + gb / c.disk_gb_s;
            m.host_ready = disk_free;
            m.gb += gb;
            break;
          case action_kind::load: {
            // Only what is not on the device yet moves (a streamed model completing).
            const uint64_t target = a.bytes == 0 ? m.bytes : std::min<uint64_t>(a.bytes, m.bytes);
            const uint64_t have = m.on_device ? m.device_bytes : 0;
            if (target <= have) break;
            const double move = static_cast<double>(target - have) / 1e9;
            double start = std::max(now, link_free), dur = 0;
            if (m.on_host) {
              start = std::max(start, m.host_ready);
              dur = move / c.link_gb_s;
            } else {
              dur = move / c.disk_gb_s + move / c.link_gb_s;  // read from the file as it is copied
            }
            if (process_per_model) dur += secs(c.process_start);
            if (!m.on_device) {
              m.loaded_at = now;
              ++m.swaps;
            }
            m.on_device = true;
            m.device_bytes = target;
            m.device_ready = start + dur;
            link_free = m.device_ready;
            m.gb += move;
            break;
          }
          case action_kind::preempt: {
            uint64_t kv_tokens = 0;
            for (const size_t k : m.running) kv_tokens += static_cast<uint64_t>(rs[k].prefilled + rs[k].generated);
            const double kv_gb = static_cast<double>(kv_tokens * m.e->kv_bytes_per_token.value_or(0)) / 1e9;
            link_free = std::max(now, link_free) + kv_gb / c.link_gb_s;
            m.preempted.insert(m.preempted.end(), m.running.begin(), m.running.end());
            m.running.clear();
            break;
          }
          case action_kind::resume: {
            uint64_t kv_tokens = 0;
            for (const size_t k : m.preempted) kv_tokens += static_cast<uint64_t>(rs[k].prefilled + rs[k].generated);
            const double kv_gb = static_cast<double>(kv_tokens * m.e->kv_bytes_per_token.value_or(0)) / 1e9;
            link_free = std::max(now, link_free) + kv_gb / c.link_gb_s;
            m.device_ready = std::max(m.device_ready, link_free);
            m.running.insert(m.running.end(), m.preempted.begin(), m.preempted.end());
            m.preempted.clear();
            break;
          }
        }
      }
      if (!p.run.empty()) {
        model_sim& m = ms[index.at(p.run)];
        if (m.on_device && m.device_ready > now) {
          wake = std::min(wake, m.device_ready);
        } else if (m.on_device) {
          // One step: admit, a prefill chunk of up to 512 tokens, one token for every decoding
          // sequence; results land at the end of the step.
          while (!m.queue.empty() && static_cast<int>(m.running.size()) < m.e->max_sequences) {
            m.running.push_back(m.queue.front());
            m.queue.pop_front();
          }
          // A model held in part streams the rest of its weights through the link every pass.
          double step = secs(c.step_overhead) + static_cast<double>(m.bytes - m.device_bytes) / 1e9 / c.link_gb_s;
          int64_t budget = 512;
          std::vector<size_t> first_now, decoded;
          for (const size_t k : m.running) {
            auto& q = rs[k];
            if (q.prefilled < q.r->prompt) {
              const int64_t chunk = std::min(budget, q.r->prompt - q.prefilled);
              budget -= chunk;
              q.prefilled += chunk;
              step += static_cast<double>(chunk) / m.cost->prefill_tok_s;
              if (q.prefilled == q.r->prompt) first_now.push_back(k);
            } else {
              decoded.push_back(k);
            }
          }
          if (!decoded.empty())
            step += (1.0 + static_cast<double>(decoded.size() - 1) * (1.0 - m.cost->batch_gain)) / m.cost->decode_tok_s;
          const double end = now + step;
          for (const size_t k : first_now) {
            rs[k].first_token = end;
            rs[k].generated = 1;
          }
          for (const size_t k : decoded) ++rs[k].generated;
          std::vector<size_t> still;
          for (const size_t k : m.running) {
            auto& q = rs[k];
            if (q.first_token >= 0 && q.generated >= q.r->output) {
              q.done = end;
              ++finished;
            } else {
              still.push_back(k);
            }
          }
          m.running = std::move(still);
          m.last_used = end;
          busy += step;
          device_free = end;
        }
      }
      if (device_free > now) wake = std::min(wake, device_free);
      // Copies in flight finish later: look again then.
      for (const auto& m : ms)
        if (m.device_ready > now) wake = std::min(wake, m.device_ready);
      if (wake == std::numeric_limits<double>::infinity()) {
        // Nothing will change by itself: keep-alive expiries and the home model still may.
        wake = now + 1.0;
        if (next_arrival >= rs.size() && std::all_of(ms.begin(), ms.end(), [](const model_sim& m) { return m.queue.empty() && m.running.empty() && m.preempted.empty(); }))
          break;
      }
    } else {
      wake = std::min(wake, device_free);
    }
    now = std::max(now + 1e-9, wake);
  }

  sim_result out;
  out.policy = r.policy.name;
  double end = 0;
  for (const auto& q : rs) end = std::max(end, q.done);
  out.end_s = end;
  out.device_busy = end > 0 ? busy / std::max(end, secs(t.length)) : 0;
  for (const auto& m : ms) {
    if (m.e->role == configs::model_role::draft || m.e->role == configs::model_role::medusa) continue;
    model_result res;
    res.swaps = m.swaps;
    res.gb_moved = m.gb;
    const auto slo = t.slo_ttft.find(m.e->name);
    res.slo_ttft_ms = slo == t.slo_ttft.end() ? 0 : secs(slo->second) * 1e3;
    std::vector<double> ttft, e2e;
    int met = 0;
    for (const auto& q : rs) {
      if (q.r->model != m.e->name) continue;
      ++res.requests;
      const double f = q.first_token >= 0 ? (q.first_token - q.r->arrive) * 1e3 : std::numeric_limits<double>::infinity();
      ttft.push_back(f);
      e2e.push_back(q.done >= 0 ? (q.done - q.r->arrive) * 1e3 : std::numeric_limits<double>::infinity());
      if (q.first_token >= 0) {
        ++res.served;
        res.ttft_ms.push_back(f);
      }
      if (res.slo_ttft_ms == 0 ? q.first_token >= 0 : f <= res.slo_ttft_ms) ++met;
    }
    std::sort(ttft.begin(), ttft.end());
    std::sort(e2e.begin(), e2e.end());
    std::sort(res.ttft_ms.begin(), res.ttft_ms.end());
    res.ttft_p50_ms = percentile(ttft, 0.50);
    res.ttft_p95_ms = percentile(ttft, 0.95);
    res.ttft_p99_ms = percentile(ttft, 0.99);
    res.e2e_p95_ms = percentile(e2e, 0.95);
    res.slo_attainment = res.requests ? static_cast<double>(met) / res.requests : 1.0;
    out.models[m.e->name] = std::move(res);
  }
  return out;
}

}  // namespace tandem::policy
