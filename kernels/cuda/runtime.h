// The bits of the CUDA runtime the rest of tandem touches, as plain C++ (no CUDA headers):
// RAII for device buffers and streams, copies, and whether a device answers. Built only with
// the CUDA backend (TANDEM_HAVE_CUDA).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "kernels/cuda/ops.h"

namespace tandem::kernels::cuda {

// Whether device 0 answers; when not, *why (if given) says what failed. Never throws.
bool device_available(std::string* why = nullptr);

// Throws std::runtime_error "cuda: <what>: <error name> (<text>)" when the last launch or an
// asynchronous operation failed; clears non-sticky errors first read.
void check_last(const char* what);

// Memory from the CUDA runtime, freed with the object by the call that matches how it was
// allocated (device_buffer, pinned_buffer).
class cuda_memory {
 public:
  cuda_memory() = default;
  ~cuda_memory() { reset(); }
  cuda_memory(cuda_memory&& o) noexcept : p_(o.p_), n_(o.n_), free_(o.free_) {
    o.p_ = nullptr;
    o.n_ = 0;
  }
  cuda_memory& operator=(cuda_memory&& o) noexcept {
    if (this != &o) {
      reset();
      p_ = o.p_;
      n_ = o.n_;
      free_ = o.free_;
      o.p_ = nullptr;
      o.n_ = 0;
    }
    return *this;
  }
  cuda_memory(const cuda_memory&) = delete;
  cuda_memory& operator=(const cuda_memory&) = delete;

  void* get() const { return p_; }
  template <class T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t size() const { return n_; }

 protected:
  using free_fn = void (*)(void*);
  cuda_memory(void* p, size_t n, free_fn f) : p_(p), n_(p ? n : 0), free_(f) {}

 private:
  // A failing free means a dead context; a destructor cannot report it anyway.
  void reset() noexcept {
    if (p_) free_(p_);
    p_ = nullptr;
    n_ = 0;
  }
  void* p_ = nullptr;
  size_t n_ = 0;
  free_fn free_ = nullptr;
};

// cudaMalloc'd memory. Zero bytes: empty, no call.
class device_buffer : public cuda_memory {
 public:
  device_buffer() = default;
  explicit device_buffer(size_t bytes);  // throws std::runtime_error naming the size
};

// cudaHostAlloc'd (pinned) host memory: copies from it are true DMA that run after the call
// returns, so the bytes must stay unchanged until the stream has reached the copy.
class pinned_buffer : public cuda_memory {
 public:
  pinned_buffer() = default;
  explicit pinned_buffer(size_t bytes);  // throws std::runtime_error naming the size
};

// A non-blocking stream (does not serialise against the legacy default stream).
class stream {
 public:
  stream();
  ~stream();
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;
  stream_t get() const { return s_; }
  void synchronize() const;  // throws std::runtime_error when queued work failed

 private:
  stream_t s_ = nullptr;
};

// A point in a stream (cudaEvent, timing disabled): lets the host wait for the work queued
// before it without waiting for the work queued after it.
class event {
 public:
  event();  // throws std::runtime_error when the event cannot be created
  ~event();
  event(const event&) = delete;
  event& operator=(const event&) = delete;
  void record(stream_t s);
  void synchronize() const;  // throws std::runtime_error when the work before it failed

 private:
  void* e_ = nullptr;  // cudaEvent_t
};

// Work captured from a stream once and replayed with one launch (a CUDA graph): a decode step
// is hundreds of small kernels whose launch cost rivals their run time. Only stream-ordered
// work may be captured (launches, async copies, from pinned or device memory); the pointers
// and sizes captured are replayed as they were, so only the contents of buffers may change.
class graph {
 public:
  graph() = default;
  ~graph();
  graph(graph&& o) noexcept : exec_(o.exec_) { o.exec_ = nullptr; }
  graph& operator=(graph&& o) noexcept;
  graph(const graph&) = delete;
  graph& operator=(const graph&) = delete;

  // Starts capturing s (thread-local mode: other threads' CUDA calls are unaffected).
  static void begin_capture(stream_t s);
  // Ends the capture and instantiates it; throws std::runtime_error when capture failed (an
  // uncapturable call was made meanwhile).
  static graph end_capture(stream_t s);
  // Ends a capture abandoned by an exception, discarding what was captured. Never throws.
  static void abort_capture(stream_t s) noexcept;

  void launch(stream_t s) const;
  explicit operator bool() const { return exec_ != nullptr; }

 private:
  void* exec_ = nullptr;  // cudaGraphExec_t
};

// Asynchronous copies on s (host memory should be pinned for them to overlap; pageable works).
void copy_to_device(void* dst, const void* host_src, size_t bytes, stream_t s);
void copy_to_host(void* host_dst, const void* src, size_t bytes, stream_t s);
void copy_on_device(void* dst, const void* src, size_t bytes, stream_t s);
void fill_bytes(void* dst, int value, size_t bytes, stream_t s);

}  // namespace tandem::kernels::cuda
