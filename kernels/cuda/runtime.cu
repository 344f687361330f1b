// The CUDA runtime behind runtime.h: every failure becomes a std::runtime_error carrying the
// runtime's own error name and text, so a report from a user's machine says what CUDA said.
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "kernels/cuda/runtime.h"

namespace tandem::kernels::cuda {

namespace {

std::string describe(const std::string& what, cudaError_t err) {
  return "cuda: " + what + ": " + cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
}

// A failed API call also records its error as the "last error"; it is cleared here so the
// next check_last() after an unrelated launch does not report it a second time.
void check(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  cudaGetLastError();
  throw std::runtime_error(describe(what, err));
}

}  // namespace

bool device_available(std::string* why) {
  try {
    int count = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err == cudaSuccess && count == 0) {
      if (why) *why = "cuda: the runtime reports no device";
      return false;
    }
    // A listed device can still fail to give a context (driver/runtime mismatch, device in
    // exclusive use elsewhere); creating it now turns that into "unavailable" instead of a
    // failure at the first allocation.
    if (err == cudaSuccess) err = cudaSetDevice(0);
    if (err == cudaSuccess) err = cudaFree(nullptr);
    if (err != cudaSuccess) {
      cudaGetLastError();
      if (why) *why = describe("device 0", err);
      return false;
    }
    return true;
  } catch (...) {  // only std::string can throw here (allocation); the contract is never to throw
    return false;
  }
}

void check_last(const char* what) {
  const cudaError_t err = cudaGetLastError();
  if (err != cudaSuccess) throw std::runtime_error(describe(what, err));
}

namespace {

// One allocation of `bytes` by `alloc`, or null for zero bytes; throws naming `what` and the size.
template <class Alloc>
void* allocate(size_t bytes, const char* what, Alloc alloc) {
  if (bytes == 0) return nullptr;  // cudaMalloc(0) may or may not return a pointer; keep "empty" uniform
  void* p = nullptr;
  const cudaError_t err = alloc(&p, bytes);
  if (err != cudaSuccess) {
    cudaGetLastError();
    throw std::runtime_error(describe(std::string(what) + " of " + std::to_string(bytes) + " bytes", err));
  }
  return p;
}

void free_device(void* p) { cudaFree(p); }
void free_pinned(void* p) { cudaFreeHost(p); }

}  // namespace

device_buffer::device_buffer(size_t bytes)
    : cuda_memory(allocate(bytes, "cudaMalloc", [](void** p, size_t n) { return cudaMalloc(p, n); }), bytes, &free_device) {}

pinned_buffer::pinned_buffer(size_t bytes)
    : cuda_memory(allocate(bytes, "cudaHostAlloc", [](void** p, size_t n) { return cudaHostAlloc(p, n, cudaHostAllocDefault); }), bytes,
                  &free_pinned) {}

event::event() {
  cudaEvent_t e = nullptr;
  check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event create");
  e_ = e;
}

event::~event() {
  if (e_) cudaEventDestroy(static_cast<cudaEvent_t>(e_));
}

void event::record(stream_t s) { check(cudaEventRecord(static_cast<cudaEvent_t>(e_), s), "event record"); }

void event::synchronize() const { check(cudaEventSynchronize(static_cast<cudaEvent_t>(e_)), "event synchronize"); }

graph::~graph() {
  if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
}

graph& graph::operator=(graph&& o) noexcept {
  if (this != &o) {
    if (exec_) cudaGraphExecDestroy(static_cast<cudaGraphExec_t>(exec_));
    exec_ = o.exec_;
    o.exec_ = nullptr;
  }
  return *this;
}

void graph::begin_capture(stream_t s) { check(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal), "graph capture begin"); }

graph graph::end_capture(stream_t s) {
  cudaGraph_t g = nullptr;
  check(cudaStreamEndCapture(s, &g), "graph capture end");
  cudaGraphExec_t exec = nullptr;
  const cudaError_t err = cudaGraphInstantiate(&exec, g, 0);
  cudaGraphDestroy(g);  // the executable graph keeps what it needs
  check(err, "graph instantiate");
  graph out;
  out.exec_ = exec;
  return out;
}

void graph::abort_capture(stream_t s) noexcept {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  if (cudaStreamIsCapturing(s, &st) == cudaSuccess && st != cudaStreamCaptureStatusNone) {
    cudaGraph_t g = nullptr;
    if (cudaStreamEndCapture(s, &g) == cudaSuccess && g) cudaGraphDestroy(g);
  }
  cudaGetLastError();
}

void graph::launch(stream_t s) const { check(cudaGraphLaunch(static_cast<cudaGraphExec_t>(exec_), s), "graph launch"); }

stream::stream() {
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream create");
  s_ = s;
}

stream::~stream() {
  if (s_) cudaStreamDestroy(s_);
}

void stream::synchronize() const { check(cudaStreamSynchronize(s_), "stream synchronize"); }

void copy_to_device(void* dst, const void* host_src, size_t bytes, stream_t s) {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, host_src, bytes, cudaMemcpyHostToDevice, s), "copy_to_device");
}

void copy_to_host(void* host_dst, const void* src, size_t bytes, stream_t s) {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(host_dst, src, bytes, cudaMemcpyDeviceToHost, s), "copy_to_host");
}

void copy_on_device(void* dst, const void* src, size_t bytes, stream_t s) {
  if (bytes == 0) return;
  check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, s), "copy_on_device");
}

void fill_bytes(void* dst, int value, size_t bytes, stream_t s) {
  if (bytes == 0) return;
  check(cudaMemsetAsync(dst, value, bytes, s), "fill_bytes");
}

}  // namespace tandem::kernels::cuda
