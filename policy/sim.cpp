#include "policy/sim.h"

#include <algorithm>
#include <cmath>
#include <deque>
#include <limits>
#include <optional>

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
  double weights_ready = 0, first_layer_at = 0;  // the last load: when it ends, when its first layer is there
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
    auto add = [&](double at) { out.push_back({at, st.model, g.between(st.prompt.min, st.prompt.max), g.between(st.output.min, st.output.max)}); };
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
  std::stable_sort(out.begin(), out.end(),
                   [](const sim_request& a, const sim_request& b) { return a.arrive != b.arrive ? a.arrive < b.arrive : a.model < b.model; });
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
  double now = 0, device_free = 0, link_free = 0, link_out_free = 0, disk_free = 0, busy = 0;
  size_t next_arrival = 0, finished = 0;
  // Arrival counts per model over the last minute, for the planner's prefetching.
  const double horizon = secs(t.length) + 3600;  // an hour to drain after the trace ends

  // The pass in flight (or the last one), and one that a higher-priority model's work
  // interrupted at a layer boundary: its results land when it has run its remaining time.
  struct pass {
    size_t model = 0;
    double start = 0, end = 0, layer_s = 0;
    std::vector<size_t> finishing;  // requests whose first token or end the pass produces
    double first_pause = -1;        // when other work first ran inside it (its wait counts from there)
  };
  pass current;
  bool has_current = false, paused_on = false;
  pass paused;
  double paused_at = 0;
  // One step of model i from `now`: admit, a prefill chunk of up to 512 tokens, one token for
  // every decoding sequence; results are stamped with the end of the step.
  auto run_step = [&](size_t i) {
    model_sim& m = ms[i];
    while (!m.queue.empty() && static_cast<int>(m.running.size()) < m.e->max_sequences) {
      m.running.push_back(m.queue.front());
      m.queue.pop_front();
    }
    // A model held in part streams the rest of its weights through the link every pass.
    double step = secs(c.step_overhead) + static_cast<double>(m.bytes - m.device_bytes) / 1e9 / c.link_gb_s;
    // Prompt rows of a pass: a chunk of 512; while the weights are still landing, as much as
    // a pass holds (2048), since the copy, not the rows, sets the pace of that pass.
    int64_t budget = m.device_ready > now ? 2048 : 512;
    std::vector<size_t> first_now, decoded;
    int64_t prompt_rows = 0;
    for (const size_t k : m.running) {
      auto& q = rs[k];
      if (q.prefilled < q.r->prompt) {
        const int64_t chunk = std::min(budget, q.r->prompt - q.prefilled);
        budget -= chunk;
        q.prefilled += chunk;
        prompt_rows += chunk;
        if (q.prefilled == q.r->prompt) first_now.push_back(k);
      } else {
        decoded.push_back(k);
      }
    }
    // A decode-only pass is paced by reading the weights; one with a prompt chunk by its rows,
    // the decode rows riding along like prompt rows (the weights are read once per pass).
    double compute = static_cast<double>(prompt_rows) / m.cost->prefill_tok_s;
    if (!decoded.empty()) {
      const auto n = static_cast<double>(decoded.size());
      const double decode_only = (1.0 + (n - 1) * (1.0 - m.cost->batch_gain)) / m.cost->decode_tok_s;
      compute = prompt_rows > 0 ? std::max(compute + n / m.cost->prefill_tok_s, decode_only) : decode_only;
    }
    step += compute;
    const double layer_s = step / std::max(1, m.cost->layers);
    double end = now + step;
    // Weights still landing (a swap-in under way): layer l computes once it is on the device,
    // so the pass ends one layer after the copy at the earliest.
    if (m.device_ready > now) end = std::max(std::max(now, m.first_layer_at) + step, m.device_ready + layer_s);
    current = {i, end - step, end, layer_s, first_now, -1};
    has_current = true;
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
        if (std::find(first_now.begin(), first_now.end(), k) == first_now.end()) current.finishing.push_back(k);
      } else {
        still.push_back(k);
      }
    }
    m.running = std::move(still);
    m.last_used = end;
    busy += step;
    device_free = end;
  };
  // A model whose work may run inside the paused (or running) pass of model `outer`: all its
  // weights on the device and ready, work it can start, and the policy's consent.
  auto interleaving = [&](size_t outer, double paused_s) -> std::optional<size_t> {
    std::optional<size_t> best;
    for (size_t j = 0; j < ms.size(); ++j) {
      const model_sim& m = ms[j];
      if (j == outer || !m.on_device || m.device_bytes < m.bytes || m.device_ready > now) continue;
      // (Preempted sequences need their KV copied back: a memory action, the plan's business.)
      if (!m.preempted.empty()) continue;
      const bool work = !m.running.empty() || (!m.queue.empty() && static_cast<int>(m.running.size()) < m.e->max_sequences);
      if (!work ||
          !may_interleave(r, *ms[outer].e, *m.e, std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::duration<double>(paused_s))))
        continue;
      if (!best || m.e->priority > ms[*best].e->priority) best = j;
    }
    return best;
  };
  while ((finished < rs.size() || paused_on) && now <= horizon) {
    while (next_arrival < rs.size() && rs[next_arrival].r->arrive <= now) {
      const auto it = index.find(rs[next_arrival].r->model);
      if (it != index.end())
        ms[it->second].queue.push_back(next_arrival);
      else
        ++finished;  // a model the roster does not have: dropped (the loader refuses such traces)
      ++next_arrival;
    }
    double wake = next_arrival < rs.size() ? rs[next_arrival].r->arrive : std::numeric_limits<double>::infinity();
    if (device_free <= now && paused_on) {
      // A pass is paused mid-way: it holds its layers, so nothing is planned; interleaved work
      // runs until none is left (or the pass has waited max_wait), then the pass goes on.
      if (const auto j = interleaving(paused.model, now - paused.first_pause)) {
        run_step(*j);
      } else {
        const double end = now + (paused.end - paused_at);
        for (const size_t k : paused.finishing) {
          if (rs[k].first_token == paused.end) rs[k].first_token = end;
          if (rs[k].done == paused.end) rs[k].done = end;
        }
        ms[paused.model].last_used = end;
        current = {paused.model, now, end, paused.layer_s, std::move(paused.finishing), paused.first_pause};
        paused_on = false;
        device_free = end;
      }
      wake = std::min(wake, device_free);
    } else if (device_free <= now) {
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
        // Paged KV, as the engine's pools hold it: a running sequence has the pages (blocks of
        // configs::k_kv_block_tokens positions) of the tokens it has so far; the model's
        // kv_reserve floor stays on the device whatever happens, like scratch.
        const uint64_t bt = configs::k_kv_block_tokens;
        uint64_t kv_blocks = 0;
        for (const size_t k : m.running) kv_blocks += (static_cast<uint64_t>(rs[k].prefilled + rs[k].generated) + bt - 1) / bt;
        const uint64_t page = bt * m.e->kv_bytes_per_token.value_or(0);
        const uint64_t floor = page == 0 ? 0 : (m.e->kv_reserve + page - 1) / page * page;
        s.device_other += floor;
        st.kv_device_bytes = kv_blocks * page > floor ? kv_blocks * page - floor : 0;
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
          case action_kind::evict_host:
            m.on_host = false;
            break;
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
            m.device_ready = m.weights_ready = start + dur;
            m.first_layer_at = start + dur / std::max(1, m.cost->layers);
            link_free = m.device_ready;
            m.gb += move;
            break;
          }
          case action_kind::preempt: {
            uint64_t kv_tokens = 0;
            for (const size_t k : m.running) kv_tokens += static_cast<uint64_t>(rs[k].prefilled + rs[k].generated);
            const double kv_gb = static_cast<double>(kv_tokens * m.e->kv_bytes_per_token.value_or(0)) / 1e9;
            // Device -> host: the link's other direction (a copy stream per direction; PCIe is
            // full duplex), so a swap-out does not delay the loads that follow it.
            link_out_free = std::max(now, link_out_free) + kv_gb / c.link_gb_s;
            m.preempted.insert(m.preempted.end(), m.running.begin(), m.running.end());
            m.running.clear();
            break;
          }
          case action_kind::resume: {
            // Back in once the swap-out (the link's other direction) has finished.
            link_free = std::max(link_free, link_out_free);
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
        // tandem's passes lease each layer as it lands (layer streaming), so a model being
        // swapped in starts its pass at once; a process-per-model server loads it first, and
        // swapped-in KV is needed from the first layer on.
        const bool pipelined = !process_per_model && m.device_ready == m.weights_ready;
        if (m.on_device && m.device_ready > now && !pipelined)
          wake = std::min(wake, m.device_ready);
        else if (m.on_device)
          run_step(index.at(p.run));
      }
      if (device_free > now) wake = std::min(wake, device_free);
      // Copies in flight finish later: look again then.
      for (const auto& m : ms)
        if (m.device_ready > now) wake = std::min(wake, m.device_ready);
      if (wake == std::numeric_limits<double>::infinity()) {
        // Nothing will change by itself: keep-alive expiries and the home model still may.
        wake = now + 1.0;
        if (next_arrival >= rs.size() &&
            std::all_of(ms.begin(), ms.end(), [](const model_sim& m) { return m.queue.empty() && m.running.empty() && m.preempted.empty(); }))
          break;
      }
    } else {
      wake = std::min(wake, device_free);
    }
    // A pass is in flight. Work that may interleave with it (a request of a resident
    // higher-priority model) pauses it at its next layer boundary.
    if (device_free > now && has_current && !paused_on && current.end == device_free && current.layer_s > 0 &&
        interleaving(current.model, current.first_pause < 0 ? 0 : now - current.first_pause)) {
      const double boundary = current.start + std::ceil((now - current.start) / current.layer_s) * current.layer_s;
      if (boundary < device_free) {
        paused = current;
        if (paused.first_pause < 0) paused.first_pause = boundary;
        paused_at = boundary;
        paused_on = true;
        device_free = boundary;
        wake = std::min(wake, device_free);
      }
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
