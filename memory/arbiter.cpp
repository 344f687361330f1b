#include "memory/arbiter.h"

#include <algorithm>
#include <stdexcept>
#include <utility>

namespace tandem::memory {

std::string_view status_name(status s) {
  switch (s) {
    case status::ok:
      return "ok";
    case status::no_space:
      return "no space";
    case status::busy:
      return "busy";
    case status::not_resident:
      return "not resident";
  }
  return "?";
}

std::string_view owner_kind_name(owner_kind k) {
  switch (k) {
    case owner_kind::segment:
      return "segment";
    case owner_kind::stream:
      return "stream";
    case owner_kind::kv:
      return "kv";
    case owner_kind::scratch:
      return "scratch";
  }
  return "?";
}

std::string_view residency_name(residency r) {
  switch (r) {
    case residency::absent:
      return "absent";
    case residency::in_flight:
      return "in flight";
    case residency::resident:
      return "resident";
  }
  return "?";
}

residency_lease& residency_lease::operator=(residency_lease&& o) noexcept {
  if (this != &o) {
    reset();
    owner_ = std::exchange(o.owner_, nullptr);
    model_ = o.model_;
    segment_ = o.segment_;
    slot_ = o.slot_;
    data_ = std::exchange(o.data_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
  }
  return *this;
}

void residency_lease::reset() {
  if (!owner_) return;
  owner_->end_lease(model_, segment_, slot_);
  owner_ = nullptr;
  data_ = nullptr;
  bytes_ = 0;
}

namespace {

std::unique_ptr<region> make_region(backend& b, tier t, uint64_t bytes) {
  if (bytes == 0) return nullptr;
  return b.allocate(t, static_cast<size_t>(bytes));
}

}  // namespace

arbiter::arbiter(backend& b, const arbiter_config& c)
    : backend_(b),
      config_(c),
      device_{make_region(b, tier::device, c.device_bytes), block_pool(static_cast<size_t>(c.device_bytes), c.block_bytes), {}},
      host_{make_region(b, tier::host, c.host_bytes), block_pool(static_cast<size_t>(c.host_bytes), c.block_bytes), {}} {}

arbiter::~arbiter() {
  // Every fill and copy in flight writes into memory this object owns: let them land first.
  std::vector<event> pending;
  {
    std::lock_guard lock(m_);
    for (auto& [id, e] : models_) {
      for (auto& s : e.segs) {
        pending.push_back(s.host.ready);
        pending.push_back(s.device.ready);
        pending.push_back(s.host.readers);
      }
      for (auto& sl : e.slots) pending.push_back(sl.ready);
    }
  }
  for (auto& ev : pending) ev.wait();
  backend_.synchronize();
}

arbiter::model_entry& arbiter::entry(model_id m) {
  const auto it = models_.find(m);
  if (it == models_.end()) throw std::invalid_argument("arbiter: unknown model id " + std::to_string(m));
  return it->second;
}
const arbiter::model_entry& arbiter::entry(model_id m) const { return const_cast<arbiter*>(this)->entry(m); }

std::pair<int, int> arbiter::bounds(const model_entry& e, segment_range r) const {
  const int n = static_cast<int>(e.segs.size());
  const int count = r.count < 0 ? n - r.first : r.count;
  if (r.first < 0 || r.first > n || count < 0 || r.first + count > n)
    throw std::out_of_range("arbiter: segments [" + std::to_string(r.first) + ", +" + std::to_string(r.count) + ") of model '" + e.name +
                            "' outside its " + std::to_string(n));
  return {r.first, r.first + count};
}

std::optional<size_t> arbiter::take(tier t, size_t bytes, owner who) {
  auto& p = pool(t);
  if (!p.mem) return std::nullopt;
  auto at = p.blocks.allocate(bytes);
  if (at) p.owners.emplace(*at, std::move(who));
  return at;
}

void arbiter::give_back(tier t, size_t offset) {
  auto& p = pool(t);
  p.blocks.release(offset);
  p.owners.erase(offset);
}

model_id arbiter::add_model(std::string name, std::vector<segment_source> segments) {
  std::lock_guard lock(m_);
  for (const auto& [id, e] : models_)
    if (e.name == name) throw std::invalid_argument("arbiter: a model named '" + name + "' is already registered");
  model_entry e;
  e.name = std::move(name);
  for (auto& s : segments) {
    if (!s.fill) throw std::invalid_argument("arbiter: segment '" + s.name + "' of model '" + e.name + "' has no fill function");
    e.segs.push_back({std::move(s), {}, {}, 0});
  }
  const model_id id = next_id_++;
  models_.emplace(id, std::move(e));
  return id;
}

void arbiter::wait_idle(model_id m) {
  std::vector<event> pending;
  {
    std::lock_guard lock(m_);
    auto& e = entry(m);
    for (auto& s : e.segs) {
      pending.push_back(s.host.ready);
      pending.push_back(s.device.ready);
      pending.push_back(s.host.readers);
    }
    for (auto& sl : e.slots) pending.push_back(sl.ready);
  }
  for (auto& ev : pending) ev.wait();
}

void arbiter::remove_model(model_id m) {
  // Wait for the copies outside the lock, then free under it only if, looked at again, nothing
  // is leased or in flight: another thread may have started work on the model meanwhile.
  for (;;) {
    std::vector<event> pending;
    {
      std::lock_guard lock(m_);
      auto& e = entry(m);
      for (const auto& s : e.segs)
        if (s.leases > 0) throw std::logic_error("arbiter: model '" + e.name + "' is removed while segment '" + s.src.name + "' is leased");
      for (const auto& sl : e.slots)
        if (sl.leases > 0) throw std::logic_error("arbiter: model '" + e.name + "' is removed while a stream slot is leased");
      for (const auto& s : e.segs)
        for (const event* ev : {&s.host.ready, &s.device.ready, &s.host.readers})
          if (!ev->ready()) pending.push_back(*ev);
      for (const auto& sl : e.slots)
        if (!sl.ready.ready()) pending.push_back(sl.ready);
      if (pending.empty()) {
        for (auto& s : e.segs) {
          if (s.host.allocated) give_back(tier::host, s.host.offset);
          if (s.device.allocated) give_back(tier::device, s.device.offset);
        }
        for (auto& sl : e.slots) give_back(tier::device, sl.offset);
        models_.erase(m);
        return;
      }
    }
    for (auto& ev : pending) ev.wait();
  }
}

int arbiter::segment_count(model_id m) const {
  std::lock_guard lock(m_);
  return static_cast<int>(entry(m).segs.size());
}

uint64_t arbiter::segment_bytes(model_id m, int seg) const {
  std::lock_guard lock(m_);
  const auto& e = entry(m);
  bounds(e, {seg, 1});
  return e.segs[static_cast<size_t>(seg)].src.bytes;
}

event arbiter::start_fill(segment& s, std::byte* dst) {
  auto done = std::make_shared<host_event>();
  stager_.post([fill = s.src.fill, dst, done] {
    try {
      fill(dst);
      done->signal();
    } catch (...) {
      done->fail(std::current_exception());
    }
  });
  return event(done);
}

event arbiter::start_bounced_fill(segment& s, std::byte* dst) {
  // A device the host cannot write, and no room for a host copy: fill a transient buffer in
  // ordinary RAM and copy it over (slower than from pinned memory, and nothing is kept), so a
  // small host budget limits what stays staged, not what can run.
  auto done = std::make_shared<host_event>();
  backend& b = backend_;
  stager_.post([fill = s.src.fill, dst, bytes = static_cast<size_t>(s.src.bytes), done, &b] {
    try {
      std::vector<std::byte> buf(bytes);
      fill(buf.data());
      b.copy(copy_kind::host_to_device, dst, buf.data(), bytes).wait();
      done->signal();
    } catch (...) {
      done->fail(std::current_exception());
    }
  });
  return event(done);
}

event arbiter::start_device_copy(segment& s, std::byte* dst) {
  // From the host copy (landed or still filling; the loader waits for it), after every copy
  // posted before this one: the loader runs in order.
  auto done = std::make_shared<host_event>();
  const event host_ready = s.host.ready;
  const std::byte* src = at(tier::host, s.host.offset);
  const size_t bytes = static_cast<size_t>(s.src.bytes);
  backend& b = backend_;
  loader_.post([host_ready, src, dst, bytes, done, &b] {
    // A failed fill or copy (a CUDA error) fails this event too: whoever waits on it sees the
    // error instead of reading a segment that never landed.
    try {
      host_ready.wait();
      b.copy(copy_kind::host_to_device, dst, src, bytes).wait();
      done->signal();
    } catch (...) {
      done->fail(std::current_exception());
    }
  });
  event ev(done);
  s.host.readers = ev;
  return ev;
}

arbiter::result arbiter::stage(model_id m, segment_range r) {
  std::lock_guard lock(m_);
  auto& e = entry(m);
  const auto [b, end] = bounds(e, r);
  std::vector<std::pair<int, size_t>> got;
  for (int i = b; i < end; ++i) {
    auto& s = e.segs[static_cast<size_t>(i)];
    if (s.host.allocated) continue;
    const auto at = take(tier::host, static_cast<size_t>(s.src.bytes), {owner_kind::segment, e.name, s.src.name});
    if (!at) {
      for (const auto& [j, off] : got) give_back(tier::host, off);
      return {status::no_space, {}};
    }
    got.emplace_back(i, *at);
  }
  std::vector<event> evs;
  for (int i = b; i < end; ++i) evs.push_back(e.segs[static_cast<size_t>(i)].host.ready);
  for (const auto& [i, off] : got) {
    auto& s = e.segs[static_cast<size_t>(i)];
    s.host.allocated = true;
    s.host.offset = off;
    s.host.ready = start_fill(s, at(tier::host, off));
    evs.push_back(s.host.ready);
  }
  return {status::ok, all_of(std::move(evs))};
}

arbiter::result arbiter::load(model_id m, segment_range r) {
  std::lock_guard lock(m_);
  auto& e = entry(m);
  const auto [b, end] = bounds(e, r);
  const bool direct = backend_.device_host_addressable();
  // Space first, all or nothing: device copies, and host copies where the device cannot be
  // filled from disk directly.
  std::vector<std::pair<int, size_t>> dev, host;
  std::vector<int> bounced;  // no room for a host copy: filled through a transient buffer
  auto undo = [&] {
    for (const auto& [j, off] : dev) give_back(tier::device, off);
    for (const auto& [j, off] : host) give_back(tier::host, off);
  };
  for (int i = b; i < end; ++i) {
    auto& s = e.segs[static_cast<size_t>(i)];
    if (s.device.allocated) continue;
    const auto at = take(tier::device, static_cast<size_t>(s.src.bytes), {owner_kind::segment, e.name, s.src.name});
    if (!at) {
      undo();
      return {status::no_space, {}};
    }
    dev.emplace_back(i, *at);
    if (!s.host.allocated && !direct) {
      if (const auto h = take(tier::host, static_cast<size_t>(s.src.bytes), {owner_kind::segment, e.name, s.src.name}))
        host.emplace_back(i, *h);
      else
        bounced.push_back(i);
    }
  }
  for (const auto& [i, off] : host) {
    auto& s = e.segs[static_cast<size_t>(i)];
    s.host.allocated = true;
    s.host.offset = off;
    s.host.ready = start_fill(s, at(tier::host, off));
  }
  std::vector<event> evs;
  for (int i = b; i < end; ++i) evs.push_back(e.segs[static_cast<size_t>(i)].device.ready);
  for (const auto& [i, off] : dev) {
    auto& s = e.segs[static_cast<size_t>(i)];
    s.device.allocated = true;
    s.device.offset = off;
    std::byte* dst = at(tier::device, off);
    const bool bounce = std::find(bounced.begin(), bounced.end(), i) != bounced.end();
    s.device.ready = s.host.allocated ? start_device_copy(s, dst) : bounce ? start_bounced_fill(s, dst) : start_fill(s, dst);
    evs.push_back(s.device.ready);
  }
  return {status::ok, all_of(std::move(evs))};
}

status arbiter::evict(model_id m, tier t, segment_range r) {
  if (t == tier::disk) throw std::invalid_argument("arbiter: weights cannot be evicted from the disk tier");
  std::lock_guard lock(m_);
  auto& e = entry(m);
  const auto [b, end] = bounds(e, r);
  for (int i = b; i < end; ++i) {
    const auto& s = e.segs[static_cast<size_t>(i)];
    const copy_state& c = t == tier::device ? s.device : s.host;
    if (!c.allocated) continue;
    if (!c.ready.ready() || (t == tier::device && s.leases > 0) || (t == tier::host && !c.readers.ready())) return status::busy;
  }
  for (int i = b; i < end; ++i) {
    auto& s = e.segs[static_cast<size_t>(i)];
    copy_state& c = t == tier::device ? s.device : s.host;
    if (!c.allocated) continue;
    give_back(t, c.offset);
    c = copy_state{};
  }
  return status::ok;
}

status arbiter::reserve_stream_slots(model_id m, int slots) {
  if (slots < 0) throw std::invalid_argument("arbiter: negative stream slot count " + std::to_string(slots));
  std::lock_guard lock(m_);
  auto& e = entry(m);
  for (const auto& sl : e.slots)
    if (sl.leases > 0 || !sl.ready.ready()) return status::busy;
  for (const auto& sl : e.slots) give_back(tier::device, sl.offset);
  e.slots.clear();
  size_t largest = 0;
  for (const auto& s : e.segs) largest = std::max(largest, static_cast<size_t>(s.src.bytes));
  e.slot_bytes = largest;
  for (int i = 0; i < slots; ++i) {
    const auto at = take(tier::device, largest, {owner_kind::stream, e.name, "slot " + std::to_string(i)});
    if (!at) {
      for (const auto& sl : e.slots) give_back(tier::device, sl.offset);
      e.slots.clear();
      return status::no_space;
    }
    e.slots.push_back({*at, -1, {}, 0, 0});
  }
  return status::ok;
}

// Points a free slot at `seg` and starts its copy: the least recently used slot that is
// neither leased nor filling. busy when there is none.
status arbiter::retarget_slot(model_entry& e, int seg, int* slot_out) {
  int best = -1;
  for (int i = 0; i < static_cast<int>(e.slots.size()); ++i) {
    const auto& sl = e.slots[static_cast<size_t>(i)];
    if (sl.leases > 0 || !sl.ready.ready()) continue;
    if (best < 0 || sl.last_use < e.slots[static_cast<size_t>(best)].last_use) best = i;
  }
  if (best < 0) return status::busy;
  auto& sl = e.slots[static_cast<size_t>(best)];
  auto& s = e.segs[static_cast<size_t>(seg)];
  std::byte* dst = at(tier::device, sl.offset);
  sl.seg = seg;
  sl.last_use = ++tick_;
  sl.ready = s.host.allocated ? start_device_copy(s, dst) : backend_.device_host_addressable() ? start_fill(s, dst) : start_bounced_fill(s, dst);
  *slot_out = best;
  return status::ok;
}

status arbiter::prefetch(model_id m, int seg) {
  std::lock_guard lock(m_);
  auto& e = entry(m);
  bounds(e, {seg, 1});
  if (e.segs[static_cast<size_t>(seg)].device.allocated) return status::ok;
  for (const auto& sl : e.slots)
    if (sl.seg == seg) return status::ok;
  if (e.slots.empty()) return status::not_resident;
  int slot = -1;
  return retarget_slot(e, seg, &slot);
}

residency_lease arbiter::acquire(model_id m, int seg, status* why, void* device_stream) {
  auto fail = [&](status s) {
    if (why) *why = s;
    return residency_lease{};
  };
  for (;;) {
    event wait_for;
    residency_lease lease;
    {
      std::lock_guard lock(m_);
      auto& e = entry(m);
      bounds(e, {seg, 1});
      auto& s = e.segs[static_cast<size_t>(seg)];
      int slot = -1;
      if (s.device.allocated) {
        ++s.leases;
        wait_for = s.device.ready;
        lease.data_ = at(tier::device, s.device.offset);
      } else {
        for (int i = 0; i < static_cast<int>(e.slots.size()); ++i)
          if (e.slots[static_cast<size_t>(i)].seg == seg) slot = i;
        if (slot < 0) {
          if (e.slots.empty()) return fail(status::not_resident);
          const status st = retarget_slot(e, seg, &slot);
          if (st == status::busy) {
            // Every slot is leased or filling: wait for a filling one, then look again.
            bool any_filling = false;
            for (const auto& sl : e.slots)
              if (sl.leases == 0 && !sl.ready.ready()) {
                wait_for = sl.ready;
                any_filling = true;
                break;
              }
            if (!any_filling) return fail(status::busy);
          } else if (st != status::ok) {
            return fail(st);
          }
        }
        if (slot >= 0) {
          auto& sl = e.slots[static_cast<size_t>(slot)];
          ++sl.leases;
          sl.last_use = ++tick_;
          wait_for = sl.ready;
          lease.data_ = at(tier::device, sl.offset);
        }
      }
      if (lease.data_) {
        lease.owner_ = this;
        lease.model_ = m;
        lease.segment_ = seg;
        lease.slot_ = slot;
        lease.bytes_ = s.src.bytes;
      }
    }
    // A lease's copy may be waited for on the caller's stream; waiting for a slot to fill
    // (no lease yet) is the host's.
    if (!(lease && device_stream && wait_for.wait_on(device_stream))) wait_for.wait();
    if (lease) {
      if (why) *why = status::ok;
      return lease;
    }
  }
}

void arbiter::end_lease(model_id m, int seg, int slot) {
  std::lock_guard lock(m_);
  auto& e = entry(m);
  if (slot >= 0)
    --e.slots[static_cast<size_t>(slot)].leases;
  else
    --e.segs[static_cast<size_t>(seg)].leases;
}

residency arbiter::residency_of(model_id m, int seg, tier t) const {
  std::lock_guard lock(m_);
  const auto& e = entry(m);
  bounds(e, {seg, 1});
  const auto& s = e.segs[static_cast<size_t>(seg)];
  if (t == tier::disk) return residency::resident;
  const copy_state& c = t == tier::device ? s.device : s.host;
  if (!c.allocated) return residency::absent;
  return c.ready.ready() ? residency::resident : residency::in_flight;
}

std::optional<allocation> arbiter::allocate(tier t, size_t bytes, owner who) {
  if (t == tier::disk) throw std::invalid_argument("arbiter: nothing is allocated in the disk tier");
  if (who.kind == owner_kind::segment || who.kind == owner_kind::stream)
    throw std::invalid_argument("arbiter: weight memory comes from stage/load, not allocate");
  std::lock_guard lock(m_);
  const auto off = take(t, bytes, std::move(who));
  if (!off) return std::nullopt;
  return allocation{t, *off, pool(t).blocks.size_at(*off), at(t, *off)};
}

uint64_t arbiter::free_bytes(tier t) const {
  std::lock_guard lock(m_);
  return pool(t).blocks.free_bytes();
}

void arbiter::release(const allocation& a) {
  std::lock_guard lock(m_);
  auto& p = pool(a.where);
  const auto it = p.owners.find(a.offset);
  if (it == p.owners.end() || it->second.kind == owner_kind::segment || it->second.kind == owner_kind::stream)
    throw std::logic_error("arbiter: release of an allocation that is not live (" + std::string(tier_name(a.where)) + " offset " +
                           std::to_string(a.offset) + ")");
  give_back(a.where, a.offset);
}

arbiter_snapshot arbiter::snapshot() const {
  std::lock_guard lock(m_);
  arbiter_snapshot s;
  auto totals = [](const tier_pool& p) { return tier_totals{p.blocks.capacity(), p.blocks.used(), p.blocks.largest_free()}; };
  s.device = totals(device_);
  s.host = totals(host_);
  std::map<owner, owner_bytes> by;
  for (const auto& [off, who] : device_.owners) {
    auto& o = by[who];
    o.who = who;
    o.device += device_.blocks.size_at(off);
  }
  for (const auto& [off, who] : host_.owners) {
    auto& o = by[who];
    o.who = who;
    o.host += host_.blocks.size_at(off);
  }
  for (auto& [who, o] : by) s.owners.push_back(std::move(o));
  auto res = [](const copy_state& c) { return !c.allocated ? residency::absent : c.ready.ready() ? residency::resident : residency::in_flight; };
  for (const auto& [id, e] : models_) {
    model_snapshot ms{e.name, {}, static_cast<int>(e.slots.size())};
    for (const auto& seg : e.segs) {
      ms.segments.push_back({seg.src.name, seg.src.bytes, res(seg.host), res(seg.device), seg.leases});
      for (const residency r : {res(seg.host), res(seg.device)})
        if (r == residency::in_flight) {
          ++s.copies_in_flight;
          s.bytes_in_flight += seg.src.bytes;
        }
    }
    for (const auto& sl : e.slots)
      if (!sl.ready.ready()) {
        ++s.copies_in_flight;
        s.bytes_in_flight += e.segs[static_cast<size_t>(sl.seg)].src.bytes;
      }
    s.models.push_back(std::move(ms));
  }
  return s;
}

void arbiter::check_integrity() const {
  std::lock_guard lock(m_);
  for (const tier t : {tier::device, tier::host}) {
    const auto& p = pool(t);
    p.blocks.check();
    uint64_t sum = 0;
    for (const auto& [off, who] : p.owners) {
      const size_t n = p.blocks.size_at(off);
      if (n == 0)
        throw std::logic_error("arbiter: " + std::string(tier_name(t)) + " owner entry at offset " + std::to_string(off) + " has no allocation");
      sum += n;
    }
    if (sum != p.blocks.used() || p.owners.size() != p.blocks.allocations())
      throw std::logic_error("arbiter: " + std::string(tier_name(t)) + " owners hold " + std::to_string(sum) + " bytes in " +
                             std::to_string(p.owners.size()) + " allocations, the pool " + std::to_string(p.blocks.used()) + " in " +
                             std::to_string(p.blocks.allocations()));
  }
  auto owned_by = [&](tier t, size_t off, const owner& who) {
    const auto& o = pool(t).owners;
    const auto it = o.find(off);
    return it != o.end() && it->second == who;
  };
  for (const auto& [id, e] : models_) {
    for (const auto& s : e.segs) {
      const owner who{owner_kind::segment, e.name, s.src.name};
      if (s.leases < 0) throw std::logic_error("arbiter: segment '" + s.src.name + "' of '" + e.name + "' has a negative lease count");
      if (s.leases > 0 && !s.device.allocated)
        throw std::logic_error("arbiter: segment '" + s.src.name + "' of '" + e.name + "' is leased without a device copy");
      if (s.host.allocated && !owned_by(tier::host, s.host.offset, who))
        throw std::logic_error("arbiter: host copy of '" + s.src.name + "' of '" + e.name + "' is not owned by it");
      if (s.device.allocated && !owned_by(tier::device, s.device.offset, who))
        throw std::logic_error("arbiter: device copy of '" + s.src.name + "' of '" + e.name + "' is not owned by it");
    }
    for (size_t i = 0; i < e.slots.size(); ++i) {
      const auto& sl = e.slots[i];
      if (sl.leases < 0 || (sl.leases > 0 && sl.seg < 0))
        throw std::logic_error("arbiter: stream slot " + std::to_string(i) + " of '" + e.name + "' has a stray lease count");
      if (!owned_by(tier::device, sl.offset, {owner_kind::stream, e.name, "slot " + std::to_string(i)}))
        throw std::logic_error("arbiter: stream slot " + std::to_string(i) + " of '" + e.name + "' is not owned by it");
    }
  }
}

}  // namespace tandem::memory
