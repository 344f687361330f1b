// The CUDA backend's memory side: the device tier from one cudaMalloc, the host tier from one
// cudaHostAlloc (pinned) made at start-up, a copy stream per direction, CUDA events. Built only
// when the toolkit is found (TANDEM_HAVE_CUDA); its kernels come with the CUDA issue.
#pragma once

#include <memory>
#include <string>

#include "memory/backend.h"

namespace tandem::memory {

// The backend on device 0, or null with *why saying what failed (no driver, no device) when
// no device answers; never aborts on a machine without a GPU.
std::unique_ptr<backend> make_cuda_backend(std::string* why);

}  // namespace tandem::memory
