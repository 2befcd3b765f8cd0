// Allocation accounting: the bytes every Tensor storage holds, now and at the peak, per device. Updated with
// atomics on each allocation and free, so it is exact under threads; the training loop reports from it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <new>
#include <vector>

#include "fp8kit/tensor/device.hpp"

namespace fp8kit {

// Bytes held by tensor storages. Each storage counts the bytes it really allocates: its nbytes rounded up to
// a multiple of 64 (storages are 64-byte aligned and padded); an empty tensor allocates nothing.
struct MemoryStats {
  std::int64_t current_bytes = 0;  // held now
  std::int64_t peak_bytes = 0;     // the most held at once since start-up or the last reset_peak_memory()
};

// Throws Error(kUnsupported) for a device this build cannot allocate on.
MemoryStats memory_stats(const Device& device = Device::cpu());
// Sets the peak to the current value.
void reset_peak_memory(const Device& device = Device::cpu());

namespace detail {
// Adds (or removes) bytes held outside Tensor storages to the CPU counters.
void track_cpu_bytes(std::int64_t bytes);
}  // namespace detail

// An allocator whose allocations count in memory_stats() like Tensor storages (by the bytes requested): the buffers
// of ScaledTensor (FP8 codes and scales) use it, so FP8 data saved for backward is measured, not estimated. Its
// buffers are 64-byte aligned, as Tensor storages are, so the kernels' streaming (non-temporal) stores can write
// them (a plain std::vector's large buffers sit 16 bytes past a 64-byte boundary with glibc).
template <typename T>
struct TrackedAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlignment{64};
  TrackedAllocator() noexcept = default;
  template <typename U>
  TrackedAllocator(const TrackedAllocator<U>&) noexcept {}
  T* allocate(std::size_t n) {
    if (n > std::size_t(-1) / sizeof(T)) throw std::bad_array_new_length();
    T* p = static_cast<T*>(::operator new(n * sizeof(T), kAlignment));
    detail::track_cpu_bytes(static_cast<std::int64_t>(n * sizeof(T)));
    return p;
  }
  void deallocate(T* p, std::size_t n) noexcept {
    detail::track_cpu_bytes(-static_cast<std::int64_t>(n * sizeof(T)));
    ::operator delete(p, n * sizeof(T), kAlignment);
  }
  template <typename U>
  bool operator==(const TrackedAllocator<U>&) const noexcept {
    return true;
  }
};

template <typename T>
using tracked_vector = std::vector<T, TrackedAllocator<T>>;

}  // namespace fp8kit
