// Asks the CUDA runtime for devices. Every failure (no driver, no device, driver too old) is
// a normal outcome on machines without a GPU and becomes a reason string, never an abort.
#include <cuda_runtime.h>

#include "kernels/device_probe.h"

namespace tandem::kernels::cuda {

cuda_probe_result probe() {
  cuda_probe_result r;
  r.built = true;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    r.reason = std::string("no CUDA device answered: ") + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
    cudaGetLastError();  // clear the sticky error so later calls start clean
    return r;
  }
  for (int i = 0; i < count; ++i) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, i) != cudaSuccess) continue;
    r.devices.push_back({i, prop.name, static_cast<uint64_t>(prop.totalGlobalMem), prop.major, prop.minor});
  }
  if (r.devices.empty()) r.reason = "the CUDA runtime reports no usable device";
  return r;
}

}  // namespace tandem::kernels::cuda
