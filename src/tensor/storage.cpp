// Storage allocation (64-byte aligned, padded to a multiple of 64 bytes) and the per-device allocation
// counters behind memory_stats() and reset_peak_memory().
#include "tensor/storage.hpp"

#include <atomic>
#include <new>

#include "fp8kit/common/error.hpp"
#include "fp8kit/tensor/memory.hpp"

namespace fp8kit {
namespace {

// Counters of one device. Peak is raised with a compare-and-swap loop so concurrent allocations never lose it.
struct Counters {
  std::atomic<std::int64_t> current{0};
  std::atomic<std::int64_t> peak{0};

  void add(std::int64_t bytes) {
    const std::int64_t now = current.fetch_add(bytes, std::memory_order_relaxed) + bytes;
    std::int64_t seen = peak.load(std::memory_order_relaxed);
    while (now > seen && !peak.compare_exchange_weak(seen, now, std::memory_order_relaxed)) {
    }
  }
  void remove(std::int64_t bytes) { current.fetch_sub(bytes, std::memory_order_relaxed); }
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

MemoryStats memory_stats(const Device& device) {
  const Counters& c = counters_for(device);
  return {c.current.load(std::memory_order_relaxed), c.peak.load(std::memory_order_relaxed)};
}

void reset_peak_memory(const Device& device) {
  Counters& c = counters_for(device);
  c.peak.store(c.current.load(std::memory_order_relaxed), std::memory_order_relaxed);
}

namespace detail {

Storage::Storage(std::int64_t nbytes, Device device) : nbytes_(nbytes), device_(device) {
  Counters& counters = counters_for(device);
  FP8KIT_CHECK(nbytes >= 0, "negative storage size ", nbytes);
  if (nbytes == 0) return;
  constexpr std::int64_t a = static_cast<std::int64_t>(kAlignment);
  allocated_ = (nbytes + a - 1) / a * a;
  data_ = static_cast<std::byte*>(::operator new (static_cast<std::size_t>(allocated_), std::align_val_t{kAlignment}));
  counters.add(allocated_);
}

Storage::~Storage() {
  if (data_ == nullptr) return;
  ::operator delete (data_, std::align_val_t{kAlignment});
  cpu_counters().remove(allocated_);
}

}  // namespace detail
}  // namespace fp8kit
