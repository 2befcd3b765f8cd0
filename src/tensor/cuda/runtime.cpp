// The CUDA runtime behind the tensor layer (built with FP8KIT_HAVE_CUDA only): device discovery for fp8kit::cuda,
// and cuda_backend's pooled allocations, copies and zero fills. Host code: it calls the runtime API and launches
// no kernel of its own.
#include <cuda_runtime_api.h>

#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "fp8kit/common/error.hpp"
#include "fp8kit/tensor/cuda.hpp"
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

namespace detail::cuda_backend {

void* allocate(std::int64_t nbytes, int index) {
  keep_pool_memory(index);
  const CurrentDevice current(index);
  void* p = nullptr;
  const cudaError_t status = cudaMallocAsync(&p, static_cast<std::size_t>(nbytes), cudaStreamLegacy);
  if (status != cudaSuccess) {
    cudaGetLastError();
    fail(status, "cudaMallocAsync of " + std::to_string(nbytes) + " bytes on " + where(index));
  }
  return p;
}

void release(void* pointer, int index) noexcept {
  int previous = 0;
  if (cudaGetDevice(&previous) != cudaSuccess) return;
  if (previous != index) cudaSetDevice(index);
  cudaFreeAsync(pointer, cudaStreamLegacy);
  if (previous != index) cudaSetDevice(previous);
}

void copy(void* dst, const Device& to, const void* src, const Device& from, std::int64_t nbytes) {
  // With unified addressing the runtime knows each pointer's place (cudaMemcpyDefault); on the legacy default
  // stream the copy follows every allocation and kernel queued before it, and the host waits for it.
  const int index = to.is_cpu() ? from.index : to.index;
  const CurrentDevice current(index);
  check(cudaMemcpy(dst, src, static_cast<std::size_t>(nbytes), cudaMemcpyDefault),
        "cudaMemcpy of " + std::to_string(nbytes) + " bytes from " + to_string(from) + " to " + to_string(to));
}

void zero(void* dst, int index, std::int64_t nbytes) {
  // Queued on the legacy default stream: every later copy and kernel on it sees the zeros.
  const CurrentDevice current(index);
  check(cudaMemset(dst, 0, static_cast<std::size_t>(nbytes)),
        "cudaMemset of " + std::to_string(nbytes) + " bytes on " + where(index));
}

}  // namespace detail::cuda_backend
}  // namespace fp8kit
