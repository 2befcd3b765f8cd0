// Allocation accounting: the bytes every Tensor storage holds, now and at the peak, per device, and by what they
// hold (parameters, gradients, optimizer state, activations, temporaries: the category in force on the allocating
// thread). Updated with atomics on each allocation and free, so it is exact under threads; the training loop
// reports from it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "fp8kit/tensor/device.hpp"

namespace fp8kit {

// What an allocation holds, as the code that makes it says (MemoryCategoryScope); kTemporary unless told.
enum class MemoryCategory : std::uint8_t {
  kTemporary,       // workspaces, GEMM operands, gradients of activations: anything not named below
  kParameters,      // model parameters (master weights)
  kGradients,       // parameter gradients
  kOptimizerState,  // optimizer moments, scales, compensation buffers
  kActivations,     // what a training forward allocates (saved for backward, and its outputs)
};
inline constexpr std::size_t kMemoryCategories = 5;
// "temporary", "parameters", "gradients", "optimizer_state", "activations".
std::string_view name(MemoryCategory category);

// Bytes held by tensor storages. Each storage counts the bytes it really allocates: its nbytes rounded up to
// a multiple of 64 (storages are 64-byte aligned and padded); an empty tensor allocates nothing.
struct MemoryStats {
  std::int64_t current_bytes = 0;  // held now
  std::int64_t peak_bytes = 0;     // the most held at once since start-up or the last reset_peak_memory()
  // By category (index: MemoryCategory): held now, and held at the moment of the peak. They sum to peak_bytes when
  // allocations come from one thread at a time; under concurrent ones the breakdown is the categories' counts a
  // moment after the peak, which can fall short of peak_bytes by what the other threads allocated or freed
  // meanwhile (measured: 17% with four threads allocating at once).
  std::array<std::int64_t, kMemoryCategories> current_by_category{};
  std::array<std::int64_t, kMemoryCategories> peak_by_category{};
};

// Throws Error(kUnsupported) for a device this build cannot allocate on.
MemoryStats memory_stats(const Device& device = Device::cpu());
// Sets the peak to the current value (and its breakdown to the current one).
void reset_peak_memory(const Device& device = Device::cpu());

// A cap on the bytes the device's tensor storages may hold at once (0, the default: none). An allocation that
// would take them past it throws Error(kUnsupported) "out of memory: ..." before any memory is taken, where the
// operating system would let it through and later end the process for using it (Linux's overcommit): `fp8kit train`
// sets it to 90% of the memory available when it starts. Storages already held are not affected.
void set_memory_limit(std::int64_t bytes, const Device& device = Device::cpu());
std::int64_t memory_limit(const Device& device = Device::cpu());

// Sets the category of the allocations this thread makes while the scope lives (scopes nest; the previous one
// returns at its end). Storage remembers its category, so a free subtracts from the category it was counted in.
class MemoryCategoryScope {
 public:
  explicit MemoryCategoryScope(MemoryCategory category) noexcept;
  ~MemoryCategoryScope();
  MemoryCategoryScope(const MemoryCategoryScope&) = delete;
  MemoryCategoryScope& operator=(const MemoryCategoryScope&) = delete;

 private:
  MemoryCategory previous_;
};

// The category this thread's allocations are counted in now.
MemoryCategory current_memory_category() noexcept;

}  // namespace fp8kit
