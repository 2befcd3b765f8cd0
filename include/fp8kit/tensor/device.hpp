// Where a tensor's storage lives: the CPU now, CUDA devices later. Only the CPU allocates in this build;
// asking for a CUDA device is a clear Error(kUnsupported), never a silent fallback.
#pragma once

#include <cstdint>
#include <string>

namespace fp8kit {

struct Device {
  enum class Kind : std::uint8_t { kCpu, kCuda };
  Kind kind = Kind::kCpu;
  int index = 0;  // the CUDA device ordinal; always 0 for the CPU

  static constexpr Device cpu() { return Device{}; }
  static constexpr Device cuda(int index = 0) { return Device{Kind::kCuda, index}; }
  constexpr bool is_cpu() const { return kind == Kind::kCpu; }
  friend constexpr bool operator==(const Device&, const Device&) = default;
};

// As PyTorch prints devices: "cpu", "cuda:0".
std::string to_string(const Device& device);

// Whether this build can allocate on `device` (the CPU only, for now).
bool is_available(const Device& device);

// Throws Error(kUnsupported) naming the device when this build cannot allocate on it ("this build of fp8kit
// has no CUDA backend").
void check_available(const Device& device);

}  // namespace fp8kit
