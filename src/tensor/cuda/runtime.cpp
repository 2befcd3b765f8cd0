// The CUDA runtime behind the tensor layer (built with FP8KIT_HAVE_CUDA only): device discovery for fp8kit::cuda,
// and cuda_backend's pooled allocations, copies and zero fills. Host code: it calls the runtime API and launches
// no kernel of its own.
#include <cuda_runtime_api.h>

#include <array>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "fp8kit/common/error.hpp"
#include "fp8kit/tensor/cuda.hpp"
#include "fp8kit/tensor/cuda_stream.hpp"
#include "tensor/cuda/streams.hpp"
#include "tensor/cuda_backend.hpp"

namespace fp8kit {
namespace {

// "cudaMallocAsync on cuda:0: out of memory (cudaErrorMemoryAllocation)".
[[noreturn]] void fail(cudaError_t status, const std::string& what) {
  FP8KIT_THROW(ErrorKind::kUnsupported, "CUDA: ", what, ": ", cudaGetErrorString(status), " (",
               cudaGetErrorName(status), ")");
}

void check(cudaError_t status, const std::string& what) {
  if (status != cudaSuccess) fail(status, what);
}

std::string where(int index) {
  return "cuda:" + std::to_string(index);
}

// Makes `index` the calling thread's current device for the scope, and restores the previous one.
class CurrentDevice {
 public:
  explicit CurrentDevice(int index) {
    check(cudaGetDevice(&previous_), "cudaGetDevice");
    if (previous_ != index) check(cudaSetDevice(index), "cudaSetDevice(" + where(index) + ")");
    index_ = index;
  }
  ~CurrentDevice() {
    if (previous_ != index_) cudaSetDevice(previous_);
  }
  CurrentDevice(const CurrentDevice&) = delete;
  CurrentDevice& operator=(const CurrentDevice&) = delete;

 private:
  int previous_ = 0;
  int index_ = 0;
};

// The device count and the runtime's verdict, asked once (the answer does not change within a process).
struct Discovery {
  int count = 0;
  cudaError_t status = cudaSuccess;
};
const Discovery& discovery() {
  static const Discovery d = [] {
    Discovery out;
    out.status = cudaGetDeviceCount(&out.count);
    if (out.status != cudaSuccess) {
      out.count = 0;
      cudaGetLastError();  // cleared, so that later calls do not report it again
    }
    return out;
  }();
  return d;
}

// Each device's memory pool keeps what is freed (release threshold: unlimited), set on first use.
void keep_pool_memory(int index) {
  static std::mutex mutex;
  static std::vector<bool> done;
  const std::lock_guard<std::mutex> lock(mutex);
  if (done.size() <= static_cast<std::size_t>(index)) done.resize(static_cast<std::size_t>(index) + 1, false);
  if (done[static_cast<std::size_t>(index)]) return;
  cudaMemPool_t pool = nullptr;
  check(cudaDeviceGetDefaultMemPool(&pool, index), "cudaDeviceGetDefaultMemPool(" + where(index) + ")");
  std::uint64_t threshold = std::numeric_limits<std::uint64_t>::max();
  check(cudaMemPoolSetAttribute(pool, cudaMemPoolAttrReleaseThreshold, &threshold),
        "cudaMemPoolSetAttribute(" + where(index) + ", release threshold)");
  done[static_cast<std::size_t>(index)] = true;
}

}  // namespace

namespace cuda {

bool built() noexcept {
  return true;
}

int runtime_version() noexcept {
  int v = 0;
  return cudaRuntimeGetVersion(&v) == cudaSuccess ? v : 0;
}

int driver_version() noexcept {
  int v = 0;
  return cudaDriverGetVersion(&v) == cudaSuccess ? v : 0;
}

int device_count() noexcept {
  return discovery().count;
}

std::string unavailable_reason() {
  const Discovery& d = discovery();
  if (d.count > 0) return {};
  if (d.status != cudaSuccess) {
    const std::string runtime = std::string(cudaGetErrorString(d.status)) + " (" + cudaGetErrorName(d.status) + ")";
    // Without any driver the runtime's words are "driver version is insufficient": say what it means.
    return driver_version() == 0 ? "no NVIDIA driver is installed: " + runtime : runtime;
  }
  return "the driver shows no CUDA device";
}

std::vector<DeviceInfo> devices() {
  std::vector<DeviceInfo> out;
  for (int i = 0; i < device_count(); ++i) {
    cudaDeviceProp p{};
    check(cudaGetDeviceProperties(&p, i), "cudaGetDeviceProperties(" + where(i) + ")");
    out.push_back(
        DeviceInfo{i, p.name, p.major, p.minor, static_cast<std::int64_t>(p.totalGlobalMem), p.multiProcessorCount});
  }
  return out;
}

void synchronize(int index) {
  const CurrentDevice current(index);
  check(cudaDeviceSynchronize(), "cudaDeviceSynchronize(" + where(index) + ")");
}

}  // namespace cuda

// ---------------------------------------------------------------- streams and events

namespace cuda::detail {

StreamState::~StreamState() {
  if (!owned) return;
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) return;
  if (previous != device) cudaSetDevice(device);
  cudaStreamSynchronize(stream);
  cudaStreamDestroy(stream);
  if (previous != device) cudaSetDevice(previous);
}

EventState::~EventState() {
  if (event != nullptr) cudaEventDestroy(event);
}

}  // namespace cuda::detail

namespace {

constexpr int kMaxStreamDevices = 64;
// Each thread's current stream per device; null: the legacy default stream.
thread_local std::array<std::shared_ptr<cuda::detail::StreamState>, kMaxStreamDevices> t_current;

std::size_t slot(int device) {
  FP8KIT_CHECK_KIND(device >= 0 && device < kMaxStreamDevices, ErrorKind::kUnsupported, "CUDA: device cuda:", device,
                    " is beyond the ", kMaxStreamDevices, " fp8kit keeps streams for");
  return static_cast<std::size_t>(device);
}

}  // namespace

namespace cuda_detail {

cudaStream_t stream_of(int device) {
  const auto& state = t_current[slot(device)];
  return state ? state->stream : cudaStreamLegacy;
}

std::shared_ptr<cuda::detail::StreamState> current_stream_state(int device) {
  return t_current[slot(device)];
}

}  // namespace cuda_detail

namespace cuda {

Stream::Stream(int device) {
  check_available(Device::cuda(device));
  const CurrentDevice current(device);
  auto state = std::make_shared<detail::StreamState>();
  state->device = device;
  check(cudaStreamCreateWithFlags(&state->stream, cudaStreamNonBlocking), "cudaStreamCreate on " + where(device));
  state->owned = true;
  state_ = std::move(state);
}

Stream Stream::legacy(int device) {
  check_available(Device::cuda(device));
  return Stream(std::shared_ptr<detail::StreamState>(new detail::StreamState{device, cudaStreamLegacy, false}));
}

int Stream::device() const noexcept {
  return state_->device;
}
bool Stream::is_legacy() const noexcept {
  return state_->stream == cudaStreamLegacy;
}
void* Stream::handle() const noexcept {
  return static_cast<void*>(state_->stream);
}
void Stream::synchronize() const {
  const CurrentDevice current(state_->device);
  check(cudaStreamSynchronize(state_->stream), "cudaStreamSynchronize on " + where(state_->device));
}
bool Stream::done() const {
  const CurrentDevice current(state_->device);
  const cudaError_t status = cudaStreamQuery(state_->stream);
  if (status == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  check(status, "cudaStreamQuery on " + where(state_->device));
  return true;
}

Stream current_stream(int device) {
  check_available(Device::cuda(device));
  const auto& state = t_current[slot(device)];
  return state ? Stream(state) : Stream::legacy(device);
}

StreamGuard::StreamGuard(const Stream& stream) : device_(stream.device()) {
  auto& current = t_current[slot(device_)];
  previous_ = current;
  // The legacy stream is the empty slot, so that allocations under its guard need no state to free on.
  current = stream.is_legacy() ? nullptr : stream.state_;
}

StreamGuard::~StreamGuard() {
  t_current[slot(device_)] = std::move(previous_);
}

Event::Event(int device, bool timing) {
  check_available(Device::cuda(device));
  const CurrentDevice current(device);
  auto state = std::make_shared<detail::EventState>();
  state->device = device;
  check(cudaEventCreateWithFlags(&state->event, timing ? cudaEventDefault : cudaEventDisableTiming),
        "cudaEventCreate on " + where(device));
  state_ = std::move(state);
}

void Event::record(const Stream& stream) {
  FP8KIT_CHECK(stream.device() == state_->device, "cuda::Event::record: the event is on ", where(state_->device),
               " and the stream on ", where(stream.device()));
  const CurrentDevice current(state_->device);
  check(cudaEventRecord(state_->event, static_cast<cudaStream_t>(stream.handle())), "cudaEventRecord");
}
void Event::record() {
  record(current_stream(state_->device));
}
void Event::wait(const Stream& stream) const {
  const CurrentDevice current(stream.device());
  check(cudaStreamWaitEvent(static_cast<cudaStream_t>(stream.handle()), state_->event, 0), "cudaStreamWaitEvent");
}
void Event::synchronize() const {
  check(cudaEventSynchronize(state_->event), "cudaEventSynchronize");
}
bool Event::done() const {
  const cudaError_t status = cudaEventQuery(state_->event);
  if (status == cudaErrorNotReady) {
    cudaGetLastError();
    return false;
  }
  check(status, "cudaEventQuery");
  return true;
}
double Event::seconds_since(const Event& start) const {
  float ms = 0.0f;
  check(cudaEventElapsedTime(&ms, start.state_->event, state_->event), "cudaEventElapsedTime");
  return static_cast<double>(ms) * 1e-3;
}

}  // namespace cuda

namespace detail::cuda_backend {

void* allocate(std::int64_t nbytes, int index, std::shared_ptr<void>& stream) {
  keep_pool_memory(index);
  const CurrentDevice current(index);
  std::shared_ptr<cuda::detail::StreamState> state = cuda_detail::current_stream_state(index);
  void* p = nullptr;
  const cudaError_t status =
      cudaMallocAsync(&p, static_cast<std::size_t>(nbytes), state ? state->stream : cudaStreamLegacy);
  if (status != cudaSuccess) {
    cudaGetLastError();
    fail(status, "cudaMallocAsync of " + std::to_string(nbytes) + " bytes on " + where(index));
  }
  stream = std::move(state);
  return p;
}

void release(void* pointer, int index, const std::shared_ptr<void>& stream) noexcept {
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) return;
  if (previous != index) cudaSetDevice(index);
  const auto* state = static_cast<const cuda::detail::StreamState*>(stream.get());
  cudaFreeAsync(pointer, state != nullptr ? state->stream : cudaStreamLegacy);
  if (previous != index) cudaSetDevice(previous);
}

void copy(void* dst, const Device& to, const void* src, const Device& from, std::int64_t nbytes) {
  // With unified addressing the runtime knows each pointer's place (cudaMemcpyDefault); on the current stream the
  // copy follows everything queued there, and with host memory involved the host waits for it.
  const int index = to.is_cpu() ? from.index : to.index;
  const CurrentDevice current(index);
  const cudaStream_t stream = cuda_detail::stream_of(index);
  const std::string what =
      "cudaMemcpyAsync of " + std::to_string(nbytes) + " bytes from " + to_string(from) + " to " + to_string(to);
  check(cudaMemcpyAsync(dst, src, static_cast<std::size_t>(nbytes), cudaMemcpyDefault, stream), what);
  if (to.is_cpu() || from.is_cpu()) check(cudaStreamSynchronize(stream), what);
}

void zero(void* dst, int index, std::int64_t nbytes) {
  const CurrentDevice current(index);
  check(cudaMemsetAsync(dst, 0, static_cast<std::size_t>(nbytes), cuda_detail::stream_of(index)),
        "cudaMemsetAsync of " + std::to_string(nbytes) + " bytes on " + where(index));
}

}  // namespace detail::cuda_backend
}  // namespace fp8kit
