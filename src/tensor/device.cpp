// Devices: their names as PyTorch prints them and which ones this build and machine can allocate on: the CPU
// always; CUDA devices when the build has the CUDA backend (src/tensor/cuda/) and the driver shows them.
#include "fp8kit/tensor/device.hpp"

#include "fp8kit/common/error.hpp"
#include "fp8kit/tensor/cuda.hpp"
#include "fp8kit/tensor/cuda_stream.hpp"

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
  if (device.kind == Device::Kind::kCpu) return true;
  return device.index >= 0 && device.index < cuda::device_count();
}

void check_available(const Device& device) {
  if (is_available(device)) return;
  FP8KIT_CHECK_KIND(cuda::built(), ErrorKind::kUnsupported, "device '", to_string(device),
                    "' is not available: this build of fp8kit has no CUDA backend (only 'cpu' can hold tensors; "
                    "build with the CUDA toolkit installed, FP8KIT_CUDA=AUTO or ON)");
  const int count = cuda::device_count();
  FP8KIT_CHECK_KIND(count > 0, ErrorKind::kUnsupported, "device '", to_string(device),
                    "' is not available: no CUDA device: ", cuda::unavailable_reason());
  FP8KIT_THROW(ErrorKind::kUnsupported, "device '", to_string(device), "' is not available: this machine shows ", count,
               " CUDA device", count == 1 ? "" : "s", " (cuda:0",
               count > 1 ? " to cuda:" + std::to_string(count - 1) : "", ")");
}

#ifndef FP8KIT_HAVE_CUDA
// The CPU-only build's answers (the CUDA build's are in src/tensor/cuda/runtime.cpp).
namespace cuda {
bool built() noexcept {
  return false;
}
int runtime_version() noexcept {
  return 0;
}
int driver_version() noexcept {
  return 0;
}
int device_count() noexcept {
  return 0;
}
std::string unavailable_reason() {
  return "this build of fp8kit has no CUDA backend";
}
std::vector<DeviceInfo> devices() {
  return {};
}
void synchronize(int index) {
  check_available(Device::cuda(index));
}

// Streams and events: every constructor and entry refuses (check_available says there is no backend); the members
// the refusals leave unreachable are defined for the link only.
namespace detail {
struct StreamState {};
struct EventState {};
}  // namespace detail
Stream::Stream(int device) {
  check_available(Device::cuda(device));
}
Stream Stream::legacy(int device) {
  return Stream(device);
}
int Stream::device() const noexcept {
  return 0;
}
bool Stream::is_legacy() const noexcept {
  return false;
}
void* Stream::handle() const noexcept {
  return nullptr;
}
void Stream::synchronize() const {}
bool Stream::done() const {
  return true;
}
Stream current_stream(int device) {
  return Stream(device);
}
StreamGuard::StreamGuard(const Stream& stream) : device_(stream.device()) {}
StreamGuard::~StreamGuard() = default;
Event::Event(int device, bool) {
  check_available(Device::cuda(device));
}
void Event::record(const Stream&) {}
void Event::record() {}
void Event::wait(const Stream&) const {}
void Event::synchronize() const {}
bool Event::done() const {
  return true;
}
double Event::seconds_since(const Event&) const {
  return 0.0;
}
}  // namespace cuda
#endif

}  // namespace fp8kit
