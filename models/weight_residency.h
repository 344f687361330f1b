// How a forward pass reaches the device bytes of a model's segments (weight_plan.h): held
// for the span of their use, so a memory arbiter can stream a model that is not all resident
// and start computing before the last segment has landed.
#pragma once

#include <cstddef>

namespace tandem::models {

class weight_residency {
 public:
  virtual ~weight_residency() = default;
  // The device copy of segment `seg`, waiting for it to land; held until release(seg). Null
  // when it cannot be had (a configuration the caller should have refused: no stream slot).
  virtual const std::byte* acquire(int seg) = 0;
  virtual void release(int seg) = 0;
  // Compute on this device stream (a cudaStream_t): from now on acquire() may return before
  // the segment's copy has landed, having queued the wait for it on the stream (the device
  // waits, not the host). A no-op where the memory cannot be waited for that way.
  virtual void set_device_stream(void* /*stream*/) {}
  // Starts bringing `seg` in without waiting (a hint: nothing happens when there is no room).
  virtual void prefetch(int seg) = 0;
  // How many segments ahead of the one in use the forward pass should prefetch.
  virtual int prefetch_depth() const = 0;
  // True while every segment stays where acquire() finds it (weights a backend uploaded
  // itself, or a hold_all in force): a pass then need not wait for its work before release().
  virtual bool fixed() const { return false; }
  // When every segment is on the device already, holds them all until release_all() and
  // returns true: the pass then takes no per-layer lease from the arbiter, and the segments
  // stay where they are (a CUDA graph may be replayed over them). False: nothing is held,
  // lease segment by segment.
  virtual bool hold_all() { return false; }
  virtual void release_all() {}
};

}  // namespace tandem::models
