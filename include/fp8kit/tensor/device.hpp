// Where a tensor's storage lives: the CPU, or a CUDA device (a build with the CUDA backend on a machine whose driver
// shows it: fp8kit/tensor/cuda.hpp). Asking for a device that is not there is a clear Error(kUnsupported) that says
// why, never a silent fallback to the CPU.
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

// Whether this build on this machine can allocate on `device`: the CPU always; cuda:i when the build has the CUDA
// backend and the driver shows more than i devices.
bool is_available(const Device& device);

// Throws Error(kUnsupported) naming the device when it is not available, and why: "this build of fp8kit has no
// CUDA backend", "no CUDA device: <the runtime's reason>", or the range of the devices there are.
void check_available(const Device& device);

}  // namespace fp8kit
