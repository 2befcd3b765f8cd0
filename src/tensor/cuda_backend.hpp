// What the tensor layer asks of the CUDA runtime (src/tensor/cuda/runtime.cpp, built with FP8KIT_HAVE_CUDA only):
// device memory from a caching pool, and copies between any two places. A failure throws Error(kUnsupported), one
// line naming the call, the device and the runtime's message.
#pragma once

#include <cstdint>
#include <memory>

#include "fp8kit/tensor/device.hpp"

namespace fp8kit::detail::cuda_backend {

// nbytes > 0 on device `index` from its memory pool (cudaMallocAsync on the calling thread's current stream of the
// device; the pool keeps freed memory for reuse instead of returning it to the driver, as a caching allocator does).
// `stream` receives what keeps that stream alive until the release (null for the legacy default stream). Throws
// when the device cannot give it (out of memory names the size).
void* allocate(std::int64_t nbytes, int index, std::shared_ptr<void>& stream);
// Returns an allocation to its device's pool, on the stream it was allocated on.
void release(void* pointer, int index, const std::shared_ptr<void>& stream) noexcept;
// nbytes from `src` on `from` to `dst` on `to` (host<->device, device<->device), on the current stream of the
// device involved: it follows everything queued there; with host memory involved the host waits for it (the host
// memory may then be reused, or read).
void copy(void* dst, const Device& to, const void* src, const Device& from, std::int64_t nbytes);
// nbytes of zero bits at `dst` on device `index`, queued on the current stream (later work on it sees them).
void zero(void* dst, int index, std::int64_t nbytes);

}  // namespace fp8kit::detail::cuda_backend
