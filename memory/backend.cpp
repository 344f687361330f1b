#include "memory/backend.h"

#include <spdlog/spdlog.h>

#include <stdexcept>

#include "memory/log.h"
#include "memory/cpu_backend.h"
#include "memory/cuda_backend.h"

namespace tandem::memory {

#if !defined(TANDEM_HAVE_CUDA)
std::unique_ptr<backend> make_cuda_backend(std::string* why) {
  if (why) *why = "this build has no CUDA support (configure with TANDEM_CUDA=ON and the CUDA toolkit)";
  return nullptr;
}
#endif

std::unique_ptr<backend> make_backend(const backend_options& options) {
  if (options.kind == backend_kind::cpu) return make_cpu_backend(options.link_gbps);
  std::string why;
  if (auto cuda = make_cuda_backend(&why)) {
    if (options.link_gbps > 0) memory::logger().warn("link_gbps applies to the CPU backend only; the CUDA backend copies at PCIe speed");
    return cuda;
  }
  if (options.kind == backend_kind::cuda) throw std::runtime_error("backend cuda requested, but " + why);
  memory::logger().info("{}; using the CPU backend", why);
  return make_cpu_backend(options.link_gbps);
}

}  // namespace tandem::memory
