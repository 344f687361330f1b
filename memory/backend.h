// What the memory arbiter needs from a device: one region per tier allocated at start-up,
// asynchronous copies between the tiers on one stream per direction, and events. Two
// implementations: the CPU backend (cpu_backend.h), whose device tier is an arena in RAM that
// stands in for VRAM, and the CUDA backend (cuda_backend.h), chosen when a GPU answers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "memory/event.h"
#include "memory/tier.h"

namespace tandem::memory {

struct backend_info {
  std::string name;           // e.g. "cpu (device tier simulated in RAM)", "cuda:0 NVIDIA H200"
  bool simulated = false;     // the device tier is host RAM standing in for VRAM
  uint64_t device_bytes = 0;  // memory of the device itself (CPU backend: installed RAM)
  double link_gbps = 0;       // host<->device copies throttled to this (simulated); 0: not throttled
};

// One tier's memory in one piece, owned by the backend that made it (RAII).
class region {
 public:
  virtual ~region() = default;
  std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  tier where() const { return tier_; }

 protected:
  region(std::byte* data, size_t size, tier t) : data_(data), size_(size), tier_(t) {}

 private:
  std::byte* data_;
  size_t size_;
  tier tier_;
};

enum class copy_kind : uint8_t { host_to_device, device_to_host };

class backend {
 public:
  virtual ~backend() = default;
  virtual backend_info info() const = 0;
  // `bytes` of the device or host tier in one piece. Throws std::runtime_error naming the tier
  // and size when the memory cannot be had (never for the disk tier, which is not allocated).
  virtual std::unique_ptr<region> allocate(tier t, size_t bytes) = 0;
  // Whether host code may write device-tier memory directly (true for the CPU backend), so a
  // weight segment can be filled from disk without a bounce through the host tier.
  virtual bool device_host_addressable() const = 0;
  // Enqueues a copy on the stream of its direction; copies of one direction run in the order
  // they were enqueued, the two directions concurrently. Both ranges must stay valid until the
  // event completes.
  virtual event copy(copy_kind kind, void* dst, const void* src, size_t bytes) = 0;
  // Waits for every copy enqueued so far.
  virtual void synchronize() = 0;
};

enum class backend_kind : uint8_t { automatic, cpu, cuda };

struct backend_options {
  backend_kind kind = backend_kind::automatic;
  double link_gbps = 0;  // CPU backend only: throttle host<->device copies (simulated PCIe)
};

// automatic: CUDA when the build has it and a device answers, otherwise CPU with one log line
// saying why. cuda: throws std::runtime_error with the reason when no device answers.
std::unique_ptr<backend> make_backend(const backend_options& options);

}  // namespace tandem::memory
