// Storage allocation (64-byte aligned, padded to a multiple of 64 bytes) and the per-device allocation
// counters behind memory_stats() and reset_peak_memory(), by category.
#include "tensor/storage.hpp"

#include <array>
#include <atomic>
#include <new>

#include "fp8kit/common/error.hpp"
#include "fp8kit/tensor/memory.hpp"

namespace fp8kit {
namespace {

thread_local MemoryCategory t_category = MemoryCategory::kTemporary;

// Counters of one device. Peak is raised with a compare-and-swap loop so concurrent allocations never lose it; the
// allocation that raises it copies the per-category counters as the peak's breakdown.
struct Counters {
  std::atomic<std::int64_t> current{0};
  std::atomic<std::int64_t> peak{0};
  std::array<std::atomic<std::int64_t>, kMemoryCategories> by_category{};
  std::array<std::atomic<std::int64_t>, kMemoryCategories> peak_by_category{};

  void snapshot_peak() {
    for (std::size_t i = 0; i < kMemoryCategories; ++i) {
      peak_by_category[i].store(by_category[i].load(std::memory_order_relaxed), std::memory_order_relaxed);
    }
  }
  void add(std::int64_t bytes, MemoryCategory category) {
    by_category[static_cast<std::size_t>(category)].fetch_add(bytes, std::memory_order_relaxed);
    const std::int64_t now = current.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    std::int64_t seen = peak.load(std::memory_order_relaxed);
    while (now > seen) {
      if (peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
        snapshot_peak();
        break;
      }
    }
  }
  void remove(std::int64_t bytes, MemoryCategory category) {
    by_category[static_cast<std::size_t>(category)].fetch_sub(bytes, std::memory_order_relaxed);
    current.fetch_sub(bytes, std::memory_order_relaxed);
  }
};

Counters& cpu_counters() {
  static Counters counters;
  return counters;
}

Counters& counters_for(const Device& device) {
  check_available(device);
  return cpu_counters();
}

}  // namespace

std::string_view name(MemoryCategory category) {
  switch (category) {
    case MemoryCategory::kTemporary:
      return "temporary";
    case MemoryCategory::kParameters:
      return "parameters";
    case MemoryCategory::kGradients:
      return "gradients";
    case MemoryCategory::kOptimizerState:
      return "optimizer_state";
    case MemoryCategory::kActivations:
      return "activations";
  }
  return "?";
}

MemoryStats memory_stats(const Device& device) {
  const Counters& c = counters_for(device);
  MemoryStats stats{c.current.load(std::memory_order_relaxed), c.peak.load(std::memory_order_relaxed), {}, {}};
  for (std::size_t i = 0; i < kMemoryCategories; ++i) {
    stats.current_by_category[i] = c.by_category[i].load(std::memory_order_relaxed);
    stats.peak_by_category[i] = c.peak_by_category[i].load(std::memory_order_relaxed);
  }
  return stats;
}

void reset_peak_memory(const Device& device) {
  Counters& c = counters_for(device);
  c.peak.store(c.current.load(std::memory_order_relaxed), std::memory_order_relaxed);
  c.snapshot_peak();
}

MemoryCategoryScope::MemoryCategoryScope(MemoryCategory category) noexcept : previous_(t_category) {
  t_category = category;
}

MemoryCategoryScope::~MemoryCategoryScope() {
  t_category = previous_;
}

MemoryCategory current_memory_category() noexcept {
  return t_category;
}

namespace detail {

Storage::Storage(std::int64_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  Counters& counters = counters_for(device);
  FP8KIT_CHECK(nbytes >= 0, "negative storage size ", nbytes);
  if (nbytes == 0) return;
  constexpr std::int64_t a = static_cast<std::int64_t>(kAlignment);
  allocated_ = (nbytes + a - 1) / a * a;
  data_ = static_cast<std::byte*>(::operator new (static_cast<std::size_t>(allocated_), std::align_val_t{kAlignment}));
  category_ = t_category;
  counters.add(allocated_, category_);
}

Storage::~Storage() {
  if (data_ == nullptr) return;
  ::operator delete (data_, std::align_val_t{kAlignment});
  cpu_counters().remove(allocated_, category_);
}

}  // namespace detail
}  // namespace fp8kit
