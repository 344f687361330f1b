// Which compute devices answer at run time. The CPU backend is always available; CUDA devices
// are listed only when the CUDA backend was built and a driver and device respond.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace tandem::kernels {

struct cuda_device_info {
  int index = 0;
  std::string name;
  uint64_t total_bytes = 0;
  int compute_major = 0;
  int compute_minor = 0;
};

struct cuda_probe_result {
  bool built = false;  // compiled with the CUDA backend
  std::vector<cuda_device_info> devices;
  std::string reason;  // why no device is usable (empty when devices exist)
};

// Never throws and never aborts: a missing driver or device is reported in `reason`.
cuda_probe_result probe_cuda();

}  // namespace tandem::kernels
