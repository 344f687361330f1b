// A model's segments registered with a memory arbiter, and the weight_residency a forward
// pass uses to lease them. Placing the segments (stage, load, evict, stream slots) is the
// caller's business (the engine, the policy); this only reads what is there.
#pragma once

#include <string>
#include <vector>

#include "memory/arbiter.h"
#include "models/model.h"
#include "models/weight_residency.h"

namespace tandem::models {

// Segment sources for the arbiter: sizes and fill functions from the model's plan. The model
// must outlive their use.
std::vector<memory::segment_source> segment_sources(const model& m);

class arbiter_residency final : public weight_residency {
 public:
  // Registers the model's segments under `name` (removed again by the destructor, which
  // waits for copies in flight). The model and arbiter must outlive this object.
  arbiter_residency(memory::arbiter& a, const model& m, std::string name, int prefetch_depth = 2);
  ~arbiter_residency() override;
  arbiter_residency(const arbiter_residency&) = delete;
  arbiter_residency& operator=(const arbiter_residency&) = delete;

  memory::model_id id() const { return id_; }
  memory::arbiter& arbiter() { return a_; }

  // Lets the forward pass run even when the segments do not all fit: when some segment is not
  // on the device, reserves prefetch depth + 1 stream slots (the segment in use and the ones
  // copying ahead of it; the pass holds one segment at a time). Returns the arbiter's status.
  memory::status prepare_streaming();

  const std::byte* acquire(int seg) override;
  void release(int seg) override;
  void prefetch(int seg) override;
  int prefetch_depth() const override { return depth_; }
  bool fixed() const override { return whole_; }
  void set_device_stream(void* stream) override { stream_ = stream; }
  bool hold_all() override;
  void release_all() override;

 private:
  memory::arbiter& a_;
  int depth_;  // before id_: checked before the model is registered
  memory::model_id id_;
  std::vector<memory::residency_lease> leases_;  // per segment, held between acquire and release
  std::vector<int> holds_;                       // acquire calls not yet released, per segment
  bool whole_ = false;                           // hold_all in force
  void* stream_ = nullptr;                       // set_device_stream
};

}  // namespace tandem::models
