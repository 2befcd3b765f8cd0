// Devices: their names as PyTorch prints them and which ones this build can allocate on (the CPU only until
// the CUDA backend lands).
#include "fp8kit/tensor/device.hpp"

#include "fp8kit/common/error.hpp"

namespace fp8kit {

std::string to_string(const Device& device) {
  switch (device.kind) {
    case Device::Kind::kCpu:
      return "cpu";
    case Device::Kind::kCuda:
      return "cuda:" + std::to_string(device.index);
  }
  return "unknown";
}

bool is_available(const Device& device) {
  return device.kind == Device::Kind::kCpu;
}

void check_available(const Device& device) {
  FP8KIT_CHECK_KIND(is_available(device), ErrorKind::kUnsupported, "device '", to_string(device),
                    "' is not available: this build of fp8kit has no CUDA backend (only 'cpu' can hold tensors)");
}

}  // namespace fp8kit
