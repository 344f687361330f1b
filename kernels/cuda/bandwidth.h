// Copy bandwidth as the device itself times it: one copy between CUDA events, so what
// `tandem bench gpu` reports as a ceiling (host -> device from pinned memory, device ->
// device) excludes launch latency and host-side waiting. Built only with the CUDA backend
// (TANDEM_HAVE_CUDA).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cuda/runtime.h"

namespace tandem::kernels::cuda {

enum class copy_path : uint8_t {
  host_to_device,    // src host memory (pinned for a true DMA), dst device memory
  device_to_device,  // both device memory; reads and writes `bytes` each
};

// Seconds one copy of `bytes` from src to dst takes on stream s, between an event recorded
// just before it and one just after it. Work already queued on s is waited for first, so it
// is not counted. Returns when the copy has landed; throws std::runtime_error naming the step
// when a CUDA call fails.
double time_copy_s(copy_path path, void* dst, const void* src, size_t bytes, stream_t s);

}  // namespace tandem::kernels::cuda
