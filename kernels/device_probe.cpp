#include "kernels/device_probe.h"

namespace tandem::kernels {

#if defined(TANDEM_HAVE_CUDA)
namespace cuda {
cuda_probe_result probe();  // kernels/cuda/device_probe.cu
}
cuda_probe_result probe_cuda() { return cuda::probe(); }
#else
cuda_probe_result probe_cuda() {
  cuda_probe_result r;
  r.reason = "built without CUDA (TANDEM_CUDA=OFF or nvcc not found)";
  return r;
}
#endif

}  // namespace tandem::kernels
