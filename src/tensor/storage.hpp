// A tensor's storage: one 64-byte-aligned allocation, shared by every Tensor that views it and freed with the
// last; each allocation and free updates the device's MemoryStats.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "fp8kit/tensor/device.hpp"
#include "fp8kit/tensor/memory.hpp"

namespace fp8kit::detail {

class Storage {
 public:
  static constexpr std::size_t kAlignment = 64;

  // nbytes may be 0 (no allocation). Throws Error(kUnsupported) for a device this build cannot allocate on.
  Storage(std::int64_t nbytes, Device device);
  ~Storage();
  Storage(const Storage&) = delete;
  Storage& operator=(const Storage&) = delete;

  std::byte* data() const noexcept { return data_; }
  std::int64_t nbytes() const noexcept { return nbytes_; }
  // What the allocation really holds (nbytes rounded up to a multiple of kAlignment), as MemoryStats counts it.
  std::int64_t allocated_bytes() const noexcept { return allocated_; }
  Device device() const noexcept { return device_; }

 private:
  std::byte* data_ = nullptr;
  std::int64_t nbytes_ = 0;
  std::int64_t allocated_ = 0;
  MemoryCategory category_ = MemoryCategory::kTemporary;  // the allocating thread's at construction
  Device device_;
  std::shared_ptr<void> stream_;  // a CUDA allocation's stream (kept alive to free on it); null otherwise
};

// nbytes from `src` on `from` to `dst` on `to`: memcpy between host buffers, the CUDA runtime's copy otherwise
// (cuda_backend::copy).
void copy_bytes(void* dst, const Device& to, const void* src, const Device& from, std::int64_t nbytes);

}  // namespace fp8kit::detail
