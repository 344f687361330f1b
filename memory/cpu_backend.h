// The CPU backend: the device tier is an arena of RAM of the configured VRAM size, the host
// tier a second one; copies between them are real memcpys on one copy thread per direction,
// optionally throttled to a link bandwidth to simulate PCIe. Kernels then read weights and KV
// only from the device arena, exactly as they would from VRAM, so every residency path runs
// in CI without a GPU.
#pragma once

#include <memory>

#include "memory/backend.h"

namespace tandem::memory {

// link_gbps > 0 throttles host<->device copies to that many GB/s (simulated); 0: memcpy speed.
// Throws std::invalid_argument for a negative or non-finite link_gbps.
std::unique_ptr<backend> make_cpu_backend(double link_gbps = 0);

}  // namespace tandem::memory
