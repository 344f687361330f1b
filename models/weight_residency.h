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
  // Starts bringing `seg` in without waiting (a hint: nothing happens when there is no room).
  virtual void prefetch(int seg) = 0;
  // How many segments ahead of the one in use the forward pass should prefetch.
  virtual int prefetch_depth() const = 0;
};

}  // namespace tandem::models
