// The CUDA devices this process can use: whether the build has the CUDA backend (FP8KIT_CUDA), which devices the
// driver shows, and why there are none. Tensors are placed on them with Device::cuda(i) (device.hpp); a build or a
// machine without them refuses such a device with a one-line Error(kUnsupported) that says which of the two it is.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace fp8kit::cuda {

// Whether this build has the CUDA backend (configured with FP8KIT_CUDA=AUTO where the toolkit was found, or ON).
bool built() noexcept;

// The CUDA runtime's and the driver's versions as the runtime reports them (e.g. 13000 for 13.0); 0 when not built
// or when no driver is installed.
int runtime_version() noexcept;
int driver_version() noexcept;

// The number of devices the driver shows this process (CUDA_VISIBLE_DEVICES applies); 0 when not built or when the
// driver reports none or fails (unavailable_reason() then says why).
int device_count() noexcept;

// Why device_count() is 0, in words ("this build of fp8kit has no CUDA backend", or the runtime's error such as
// "no CUDA-capable device is detected"); empty when there are devices.
std::string unavailable_reason();

struct DeviceInfo {
  int index = 0;
  std::string name;               // "NVIDIA H200"
  int major = 0, minor = 0;       // compute capability (9.0 for Hopper)
  std::int64_t memory_bytes = 0;  // global memory
  int multiprocessors = 0;
};
// Every visible device, by index; empty when there are none.
std::vector<DeviceInfo> devices();

// Waits until every operation queued on device `index` has finished (cudaDeviceSynchronize).
void synchronize(int index);

}  // namespace fp8kit::cuda
