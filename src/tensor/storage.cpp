// Storage allocation (64-byte aligned, padded to a multiple of 64 bytes; on a CUDA device from its memory pool) and
// the per-device allocation counters behind memory_stats() and reset_peak_memory(), by category.
#include "tensor/storage.hpp"

#include <array>
#include <atomic>
#include <cstring>
#include <new>

#include "fp8kit/common/error.hpp"
#include "fp8kit/tensor/memory.hpp"
#include "tensor/cuda_backend.hpp"

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
  std::atomic<std::int64_t> limit{0};  // set_memory_limit (0: none)

  void snapshot_peak() {
    for (std::size_t i = 0; i < kMemoryCategories; ++i) {
      peak_by_category[i].store(by_category[i].load(std::memory_order_relaxed), std::memory_order_relaxed);
    }
  }
  // Counts `bytes` as held unless a limit is set and they would pass it (the check and the count in one atomic
  // step, so that allocations on several threads cannot pass it together); `*held` is what is held then, or, when
  // refused, now. The bytes are not yet in a category or the peak: add() does that once they are allocated.
  bool reserve(std::int64_t bytes, std::int64_t* held) {
    const std::int64_t cap = limit.load(std::memory_order_relaxed);
    std::int64_t now = current.load(std::memory_order_relaxed);
    do {
      if (cap > 0 && now + bytes > cap) {
        *held = now;
        return false;
      }
    } while (!current.compare_exchange_weak(now, now + bytes, std::memory_order_relaxed));
    *held = now + bytes;
    return true;
  }
  void unreserve(std::int64_t bytes) { current.fetch_sub(bytes, std::memory_order_relaxed); }
  void add(std::int64_t bytes, std::int64_t now, MemoryCategory category) {
    by_category[static_cast<std::size_t>(category)].fetch_add(bytes, std::memory_order_relaxed);
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

// The CPU's counters and each CUDA device's (a fixed table: counters are never moved while allocations update them).
constexpr int kMaxCudaDevices = 64;

Counters& counters_of(const Device& device) {
  static Counters cpu;
  static std::array<Counters, kMaxCudaDevices> cuda;
  if (device.is_cpu()) return cpu;
  return cuda[static_cast<std::size_t>(device.index)];
}

Counters& counters_for(const Device& device) {
  check_available(device);
  FP8KIT_CHECK_KIND(device.is_cpu() || device.index < kMaxCudaDevices, ErrorKind::kUnsupported, "device '",
                    to_string(device), "': fp8kit counts the memory of at most ", kMaxCudaDevices, " CUDA devices");
  return counters_of(device);
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

void set_memory_limit(std::int64_t bytes, const Device& device) {
  FP8KIT_CHECK(bytes >= 0, "set_memory_limit: ", bytes, " bytes is negative (0: no limit)");
  counters_for(device).limit.store(bytes, std::memory_order_relaxed);
}

std::int64_t memory_limit(const Device& device) {
  return counters_for(device).limit.load(std::memory_order_relaxed);
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
  std::int64_t held = 0;
  if (!counters.reserve(allocated_, &held)) {
    // (in bytes below 10 MB: "1 MB more ... past the 1 MB" was all a 64-byte allocation past a 1 MB limit said)
    const auto amount = [](std::int64_t bytes) {
      return bytes < 10'000'000 ? std::to_string(bytes) + " bytes"
                                : std::to_string((bytes + 999'999) / 1'000'000) + " MB";
    };
    FP8KIT_THROW(ErrorKind::kUnsupported, "out of memory: ", amount(allocated_), " more would take the tensors on ",
                 to_string(device), " to ", amount(held + allocated_), ", past the ",
                 amount(counters.limit.load(std::memory_order_relaxed)),
                 " this process may use (set_memory_limit); try smaller sizes");
  }
  try {
    if (device.is_cpu()) {
      data_ =
          static_cast<std::byte*>(::operator new (static_cast<std::size_t>(allocated_), std::align_val_t{kAlignment}));
    } else {
#ifdef FP8KIT_HAVE_CUDA
      data_ = static_cast<std::byte*>(cuda_backend::allocate(allocated_, device.index, stream_));  // 256-byte aligned
#endif
    }
  } catch (...) {
    counters.unreserve(allocated_);
    throw;
  }
  category_ = t_category;
  counters.add(allocated_, held, category_);
}

Storage::~Storage() {
  if (data_ == nullptr) return;
  if (device_.is_cpu()) {
    ::operator delete (data_, std::align_val_t{kAlignment});
  } else {
#ifdef FP8KIT_HAVE_CUDA
    cuda_backend::release(data_, device_.index, stream_);
#endif
  }
  counters_of(device_).remove(allocated_, category_);
}

void copy_bytes(void* dst, const Device& to, const void* src, const Device& from, std::int64_t nbytes) {
  if (nbytes == 0) return;
  if (to.is_cpu() && from.is_cpu()) {
    std::memcpy(dst, src, static_cast<std::size_t>(nbytes));
    return;
  }
#ifdef FP8KIT_HAVE_CUDA
  cuda_backend::copy(dst, to, src, from, nbytes);
#else
  FP8KIT_THROW(ErrorKind::kInternal, "a copy from ", to_string(from), " to ", to_string(to),
               " in a build without the CUDA backend");
#endif
}

}  // namespace detail
}  // namespace fp8kit
