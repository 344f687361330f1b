#include "kernels/cuda/bandwidth.h"

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace tandem::kernels::cuda {
namespace {

void check(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return;
  cudaGetLastError();  // a non-sticky error must not resurface in an unrelated later check
  throw std::runtime_error(std::string("cuda: ") + what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")");
}

// Both events destroyed on every path, including a throw between their creation and use.
struct event_pair {
  cudaEvent_t start = nullptr, stop = nullptr;
  event_pair() {
    check(cudaEventCreate(&start), "cannot create a timing event");
    if (const cudaError_t e = cudaEventCreate(&stop); e != cudaSuccess) {
      cudaEventDestroy(start);
      check(e, "cannot create a timing event");
    }
  }
  ~event_pair() {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
  }
  event_pair(const event_pair&) = delete;
  event_pair& operator=(const event_pair&) = delete;
};

}  // namespace

double time_copy_s(copy_path path, void* dst, const void* src, size_t bytes, stream_t s) {
  const cudaStream_t stream = s;  // stream_t names the same type without the CUDA headers
  // Earlier work on the stream would otherwise sit between the start event and the copy.
  check(cudaStreamSynchronize(stream), "work queued before a timed copy failed");
  event_pair ev;
  const cudaMemcpyKind kind = path == copy_path::host_to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToDevice;
  check(cudaEventRecord(ev.start, stream), "cannot record a timing event");
  check(cudaMemcpyAsync(dst, src, bytes, kind, stream), "cannot enqueue a timed copy");
  check(cudaEventRecord(ev.stop, stream), "cannot record a timing event");
  check(cudaEventSynchronize(ev.stop), "timed copy failed");
  float ms = 0;
  check(cudaEventElapsedTime(&ms, ev.start, ev.stop), "cannot read a copy's time");
  return static_cast<double>(ms) * 1e-3;
}

}  // namespace tandem::kernels::cuda
