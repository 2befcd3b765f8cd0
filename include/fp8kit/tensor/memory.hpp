// Allocation accounting: the bytes every Tensor storage holds, now and at the peak, per device. Updated with
// atomics on each allocation and free, so it is exact under threads; the training loop reports from it.
#pragma once

#include <cstddef>
#include <cstdint>

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

}  // namespace fp8kit
