// The memory arbiter: owns every byte of the device and host tiers. Each tier is one region
// from the backend, carved into blocks; every allocation has an owner (a model's weight
// segment, KV, scratch, a stream slot). A model's weights are segments (token embedding, each
// layer, output head) with a residency per tier; they move disk -> host -> device by
// asynchronous operations that complete with events, and are never copied back (evicting
// frees). A residency_lease keeps a device copy in place while a forward pass reads it.
//
// Budget exhaustion is a returned status, never an exception: the engine's loop handles it.
// Exceptions are for misuse (unknown model, a segment index out of range, removing a model
// whose weights are leased) and for start-up failures.
//
// Thread-safe: one mutex around the bookkeeping; fills and copies run on two worker threads
// (a stager for disk -> host/device fills, a loader for host -> device copies), so staging
// segment i+1 overlaps copying segment i.
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "memory/backend.h"
#include "memory/block_pool.h"
#include "memory/event.h"
#include "memory/job_queue.h"
#include "memory/tier.h"

namespace tandem::memory {

inline constexpr size_t k_default_block_bytes = size_t{64} << 10;

struct arbiter_config {
  uint64_t device_bytes = 0;                   // budget of the device tier (VRAM, or the CPU backend's arena)
  uint64_t host_bytes = 0;                     // budget of the pinned host tier
  size_t block_bytes = k_default_block_bytes;  // allocation granularity of both tiers
};

enum class status : uint8_t {
  ok,
  no_space,      // the tier has no free run large enough now
  busy,          // leased, or a copy from or into it is in flight
  not_resident,  // nothing to lease: not on the device and no stream slot to bring it through
};
std::string_view status_name(status s);

enum class owner_kind : uint8_t { segment, stream, kv, scratch };
std::string_view owner_kind_name(owner_kind k);

struct owner {
  owner_kind kind = owner_kind::scratch;
  std::string model;  // "" for engine-wide scratch
  std::string part;   // segment name; "" otherwise
  auto operator<=>(const owner&) const = default;
};

// How a model's weight segment is produced: its size in device form and a function writing
// that form from the disk tier (a copy of file bytes, or a repacking). fill runs on the
// arbiter's stager thread and must not throw (a model validates its file at load).
struct segment_source {
  std::string name;
  uint64_t bytes = 0;
  std::function<void(std::byte* dst)> fill;
};

using model_id = uint32_t;

// Segments [first, first + count); count < 0: to the last one.
struct segment_range {
  int first = 0;
  int count = -1;
};

enum class residency : uint8_t { absent, in_flight, resident };
std::string_view residency_name(residency r);

// KV or scratch memory handed out by allocate().
struct allocation {
  tier where = tier::device;
  size_t offset = 0;
  size_t bytes = 0;  // whole blocks
  std::byte* data = nullptr;
};

struct tier_totals {
  uint64_t capacity = 0, used = 0, largest_free = 0;
};
struct owner_bytes {
  owner who;
  uint64_t device = 0, host = 0;
};
struct segment_snapshot {
  std::string name;
  uint64_t bytes = 0;
  residency host = residency::absent, device = residency::absent;
  int leases = 0;
};
struct model_snapshot {
  std::string name;
  std::vector<segment_snapshot> segments;
  int stream_slots = 0;
};
struct arbiter_snapshot {
  tier_totals device, host;
  std::vector<owner_bytes> owners;  // sorted by owner
  std::vector<model_snapshot> models;
  int copies_in_flight = 0;
  uint64_t bytes_in_flight = 0;
};

class arbiter;

// A device copy of one segment held in place until the lease ends (move-only RAII).
class residency_lease {
 public:
  residency_lease() = default;
  ~residency_lease() { reset(); }
  residency_lease(residency_lease&& o) noexcept { *this = std::move(o); }
  residency_lease& operator=(residency_lease&& o) noexcept;
  residency_lease(const residency_lease&) = delete;
  residency_lease& operator=(const residency_lease&) = delete;

  explicit operator bool() const { return owner_ != nullptr; }
  const std::byte* data() const { return data_; }
  uint64_t bytes() const { return bytes_; }
  void reset();

 private:
  friend class arbiter;
  arbiter* owner_ = nullptr;
  model_id model_ = 0;
  int segment_ = -1;
  int slot_ = -1;  // stream slot, or -1 for the segment's own device copy
  const std::byte* data_ = nullptr;
  uint64_t bytes_ = 0;
};

class arbiter {
 public:
  // Allocates both tiers from the backend. Throws std::runtime_error when it cannot.
  arbiter(backend& b, const arbiter_config& c);
  ~arbiter();  // waits for in-flight fills and copies; leases must have ended
  arbiter(const arbiter&) = delete;
  arbiter& operator=(const arbiter&) = delete;

  backend& device_backend() { return backend_; }
  const arbiter_config& config() const { return config_; }

  // Registers a model's segments (all on disk). Throws std::invalid_argument for a duplicate
  // name or a segment without a fill function.
  model_id add_model(std::string name, std::vector<segment_source> segments);
  // Waits for the model's copies, then frees everything it holds. Throws std::logic_error
  // while one of its segments is leased.
  void remove_model(model_id m);
  int segment_count(model_id m) const;
  uint64_t segment_bytes(model_id m, int seg) const;

  struct result {
    status st = status::ok;
    event done;  // completes when every copy the call started has landed
  };
  // disk -> host for the segments not already there (or on their way). All or nothing: on
  // no_space nothing is allocated.
  result stage(model_id m, segment_range r = {});
  // -> device for the segments not already there: from the host copy when there is one, else
  // filled from disk (directly where the device is host-addressable, else through the host
  // tier, which then keeps a copy, or, when the host tier has no room, through a transient
  // buffer in RAM that is not kept). All or nothing over the device tier.
  result load(model_id m, segment_range r = {});
  // Frees the segments' copies in tier t (device or host). busy, and nothing freed, when one
  // of them is leased or a copy from or into it is in flight.
  status evict(model_id m, tier t, segment_range r = {});
  // Waits until no copy of this model is in flight.
  void wait_idle(model_id m);

  // Layer streaming: `slots` device buffers, each the size of the model's largest segment,
  // through which segments that are not resident are brought when acquired. 0 returns them
  // (busy while one is leased or filling).
  status reserve_stream_slots(model_id m, int slots);
  // Starts bringing `seg` to the device without waiting: nothing to do when it is resident or
  // already in a slot; busy when every slot is leased or still filling.
  status prefetch(model_id m, int seg);
  // The device copy of `seg`, after waiting for its copy to land. Not resident: brought
  // through a stream slot (waiting for one to free up if they are all filling). On failure an
  // empty lease, and *why says why (not_resident without slots, busy when all are leased).
  // device_stream (a cudaStream_t of the caller's compute): where the backend can, the
  // lease comes back at once and the copy is waited for on that stream instead of the host.
  residency_lease acquire(model_id m, int seg, status* why = nullptr, void* device_stream = nullptr);
  residency residency_of(model_id m, int seg, tier t) const;

  // Memory for KV and scratch. nullopt when the tier has no free run large enough.
  std::optional<allocation> allocate(tier t, size_t bytes, owner who);
  // Where tier t's region starts: every allocation's data is region_base(t) + its offset, so
  // pieces of one owner can be addressed as one base and block-sized strides (paged KV).
  std::byte* region_base(tier t) const { return pool(t).mem->data(); }
  // Bytes of tier t free now (other threads may take some meanwhile).
  uint64_t free_bytes(tier t) const;
  // Throws std::logic_error for an allocation that is not live.
  void release(const allocation& a);

  arbiter_snapshot snapshot() const;
  // Throws std::logic_error describing the first violation: pools that do not tile their
  // region, owners that do not sum to pool usage, a segment or slot with a negative or
  // stray lease count, a leased segment whose device copy is missing.
  void check_integrity() const;

 private:
  friend class residency_lease;
  struct copy_state {
    bool allocated = false;
    size_t offset = 0;
    event ready;    // the copy into it
    event readers;  // the last copy out of it (host copies only)
  };
  struct segment {
    segment_source src;
    copy_state host, device;
    int leases = 0;
  };
  struct stream_slot {
    size_t offset = 0;
    int seg = -1;
    event ready;
    int leases = 0;
    uint64_t last_use = 0;
  };
  struct model_entry {
    std::string name;
    std::vector<segment> segs;
    std::vector<stream_slot> slots;
    size_t slot_bytes = 0;
  };
  struct tier_pool {
    std::unique_ptr<region> mem;
    block_pool blocks;
    std::map<size_t, owner> owners;  // allocation offset -> owner
  };

  model_entry& entry(model_id m);
  const model_entry& entry(model_id m) const;
  tier_pool& pool(tier t) { return t == tier::device ? device_ : host_; }
  const tier_pool& pool(tier t) const { return t == tier::device ? device_ : host_; }
  std::byte* at(tier t, size_t offset) { return pool(t).mem->data() + offset; }
  std::optional<size_t> take(tier t, size_t bytes, owner who);
  void give_back(tier t, size_t offset);
  std::pair<int, int> bounds(const model_entry& e, segment_range r) const;
  // Starts copying segment s (which has a host copy or can be filled) into device memory at
  // `dst`; returns the event of its landing. Caller holds the lock.
  event start_device_copy(segment& s, std::byte* dst);
  // Fills `dst` from disk: directly (start_fill: host memory, or a host-addressable device),
  // or, for a device the host cannot write and no host copy, through a transient buffer in
  // RAM that is then copied over (start_bounced_fill).
  event start_fill(segment& s, std::byte* dst);
  event start_bounced_fill(segment& s, std::byte* dst);
  status retarget_slot(model_entry& e, int seg, int* slot_out);
  void end_lease(model_id m, int seg, int slot);

  backend& backend_;
  arbiter_config config_;
  mutable std::mutex m_;
  tier_pool device_, host_;
  std::map<model_id, model_entry> models_;
  model_id next_id_ = 1;
  uint64_t tick_ = 0;
  // Declared last: destroyed first, so their threads finish before the state they touch goes.
  job_queue stager_, loader_;
};

}  // namespace tandem::memory
