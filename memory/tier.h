// The places a byte of model state can live, fastest first.
#pragma once

#include <cstdint>
#include <string_view>

namespace tandem::memory {

// device: VRAM of one GPU (the CPU backend's budgeted arena stands in for it); host: pinned
// RAM, budgeted; disk: the mapped GGUF file, always the backing store of weights.
enum class tier : uint8_t { device = 0, host = 1, disk = 2 };

constexpr std::string_view tier_name(tier t) {
  switch (t) {
    case tier::device:
      return "device";
    case tier::host:
      return "host";
    case tier::disk:
      return "disk";
  }
  return "?";
}

}  // namespace tandem::memory
