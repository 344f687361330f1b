#include "memory/cuda_backend.h"

#include <cuda_runtime.h>

#include <mutex>
#include <stdexcept>
#include <string>

namespace tandem::memory {
namespace {

constexpr int k_device = 0;

std::string describe(cudaError_t e) { return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")"; }

// Non-sticky errors (an allocation refused, a bad argument) stay as the "last error" until read;
// reading it here keeps a later, unrelated check from reporting a failure that was handled.
[[noreturn]] void fail(const std::string& what, cudaError_t e) {
  cudaGetLastError();
  throw std::runtime_error("cuda backend: " + what + ": " + describe(e));
}

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(what, e);
}

class device_region final : public region {
 public:
  static std::unique_ptr<region> make(size_t bytes) {
    void* p = nullptr;
    if (const cudaError_t e = cudaMalloc(&p, bytes); e != cudaSuccess)
      fail("cannot allocate " + std::to_string(bytes) + " bytes for the device tier", e);
    return std::unique_ptr<region>(new device_region(static_cast<std::byte*>(p), bytes));
  }
  ~device_region() override { cudaFree(data()); }

 private:
  device_region(std::byte* p, size_t bytes) : region(p, bytes, tier::device) {}
};

// Pinned, so cudaMemcpyAsync from it is a true DMA that overlaps compute instead of a staged,
// host-synchronous copy.
class pinned_region final : public region {
 public:
  static std::unique_ptr<region> make(size_t bytes) {
    void* p = nullptr;
    if (const cudaError_t e = cudaHostAlloc(&p, bytes, cudaHostAllocDefault); e != cudaSuccess)
      fail("cannot allocate " + std::to_string(bytes) + " bytes of pinned memory for the host tier", e);
    return std::unique_ptr<region>(new pinned_region(static_cast<std::byte*>(p), bytes));
  }
  ~pinned_region() override { cudaFreeHost(data()); }

 private:
  pinned_region(std::byte* p, size_t bytes) : region(p, bytes, tier::host) {}
};

// One CUDA event per copy: it records the point in the stream right after that copy, so it
// completes when the copy and everything enqueued before it in that direction has.
class cuda_event final : public event::state {
 public:
  explicit cuda_event(cudaEvent_t e) : e_(e) {}
  ~cuda_event() override { cudaEventDestroy(e_); }  // errors ignored: may run after runtime teardown
  cuda_event(const cuda_event&) = delete;
  cuda_event& operator=(const cuda_event&) = delete;

  bool ready() const override {
    const cudaError_t e = cudaEventQuery(e_);
    if (e == cudaSuccess) return true;
    if (e == cudaErrorNotReady) return false;
    fail("copy failed", e);
  }
  void wait() const override { check(cudaEventSynchronize(e_), "copy failed"); }
  bool wait_on(void* stream) const override {
    check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream), e_, 0), "cannot queue a wait for a copy");
    return true;
  }

 private:
  cudaEvent_t e_;
};

class cuda_backend final : public backend {
 public:
  cuda_backend(const cudaDeviceProp& prop, cudaStream_t to_device, cudaStream_t to_host)
      : info_{"cuda:0 " + std::string(prop.name), false, static_cast<uint64_t>(prop.totalGlobalMem), 0}, to_device_(to_device), to_host_(to_host) {}
  ~cuda_backend() override {
    // No throw from a destructor: a failed copy has already been reported through its event.
    cudaStreamSynchronize(to_device_.stream);
    cudaStreamSynchronize(to_host_.stream);
    cudaStreamDestroy(to_device_.stream);
    cudaStreamDestroy(to_host_.stream);
    cudaGetLastError();
  }
  cuda_backend(const cuda_backend&) = delete;
  cuda_backend& operator=(const cuda_backend&) = delete;

  backend_info info() const override { return info_; }
  std::unique_ptr<region> allocate(tier t, size_t bytes) override {
    if (t == tier::disk) throw std::invalid_argument("cuda backend: the disk tier is not allocated");
    // The current device is per thread; the caller's thread may never have chosen one.
    check(cudaSetDevice(k_device), "cannot select device 0");
    return t == tier::device ? device_region::make(bytes) : pinned_region::make(bytes);
  }
  bool device_host_addressable() const override { return false; }
  event copy(copy_kind kind, void* dst, const void* src, size_t bytes) override {
    direction& d = kind == copy_kind::host_to_device ? to_device_ : to_host_;
    const cudaMemcpyKind how = kind == copy_kind::host_to_device ? cudaMemcpyHostToDevice : cudaMemcpyDeviceToHost;
    check(cudaSetDevice(k_device), "cannot select device 0");  // the event must belong to the stream's device
    cudaEvent_t e = nullptr;
    check(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "cannot create an event");
    auto state = std::make_shared<const cuda_event>(e);  // owns e from here, also when we throw
    // Copy and record together, so another thread's copy cannot land between them and an
    // event never completes before the copy it was returned for.
    std::lock_guard<std::mutex> lock(d.m);
    if (const cudaError_t err = cudaMemcpyAsync(dst, src, bytes, how, d.stream); err != cudaSuccess)
      fail("cannot enqueue a copy of " + std::to_string(bytes) + " bytes", err);
    check(cudaEventRecord(e, d.stream), "cannot record a copy's event");
    return event(std::move(state));
  }
  void synchronize() override {
    check(cudaStreamSynchronize(to_device_.stream), "copy failed");
    check(cudaStreamSynchronize(to_host_.stream), "copy failed");
  }

 private:
  struct direction {
    explicit direction(cudaStream_t s) : stream(s) {}
    cudaStream_t stream;
    std::mutex m;
  };
  backend_info info_;
  direction to_device_, to_host_;
};

}  // namespace

std::unique_ptr<backend> make_cuda_backend(std::string* why) {
  // Every failure here means "no usable GPU", not a bug: say why and let the caller fall back.
  auto refuse = [&](const std::string& what, cudaError_t e) -> std::unique_ptr<backend> {
    cudaGetLastError();
    if (why) *why = what + ": " + describe(e);
    return nullptr;
  };
  int count = 0;
  if (const cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) return refuse("no CUDA device answered", e);
  if (count < 1) {
    if (why) *why = "no CUDA device answered: the driver reports 0 devices";
    return nullptr;
  }
  if (const cudaError_t e = cudaSetDevice(k_device); e != cudaSuccess) return refuse("CUDA device 0 cannot be selected", e);
  cudaDeviceProp prop{};
  if (const cudaError_t e = cudaGetDeviceProperties(&prop, k_device); e != cudaSuccess)
    return refuse("CUDA device 0 does not report its properties", e);
  // Non-blocking: the copy streams must not serialize against the legacy default stream,
  // which compute launched without a stream would otherwise use.
  cudaStream_t to_device = nullptr, to_host = nullptr;
  if (const cudaError_t e = cudaStreamCreateWithFlags(&to_device, cudaStreamNonBlocking); e != cudaSuccess)
    return refuse("cannot create a copy stream on CUDA device 0", e);
  if (const cudaError_t e = cudaStreamCreateWithFlags(&to_host, cudaStreamNonBlocking); e != cudaSuccess) {
    cudaStreamDestroy(to_device);
    return refuse("cannot create a copy stream on CUDA device 0", e);
  }
  return std::make_unique<cuda_backend>(prop, to_device, to_host);
}

}  // namespace tandem::memory
