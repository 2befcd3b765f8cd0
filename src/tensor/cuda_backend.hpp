// What the tensor layer asks of the CUDA runtime (src/tensor/cuda/runtime.cpp, built with FP8KIT_HAVE_CUDA only):
// device memory from a caching pool, and copies between any two places. A failure throws Error(kUnsupported), one
// line naming the call, the device and the runtime's message.
#pragma once

#include <cstdint>

#include "fp8kit/tensor/device.hpp"

namespace fp8kit::detail::cuda_backend {

// nbytes > 0 on device `index` from its memory pool (cudaMallocAsync on the device's default stream; the pool keeps
// freed memory for reuse instead of returning it to the driver, as a caching allocator does). Throws when the
// device cannot give it (out of memory names the size).
void* allocate(std::int64_t nbytes, int index);
// Returns an allocation to its device's pool.
void release(void* pointer, int index) noexcept;
// nbytes from `src` on `from` to `dst` on `to` (host<->device, device<->device), on the legacy default stream: it
// follows everything queued there, and the host memory involved may be reused (or read) when it returns.
void copy(void* dst, const Device& to, const void* src, const Device& from, std::int64_t nbytes);
// nbytes of zero bits at `dst` on device `index`, queued on the legacy default stream (later copies see them).
void zero(void* dst, int index, std::int64_t nbytes);

}  // namespace fp8kit::detail::cuda_backend
