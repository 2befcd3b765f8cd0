// Internal, for every layer: when a loop is worth spreading over threads. Below these sizes one thread is faster
// than waking the others (and on an oversubscribed machine waiting threads are expensive); results never depend on
// the choice, since every parallel loop splits work in fixed pieces. One place, by the kind of work, so that a
// retune (or a backend with other costs) changes one line.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <mutex>
#include <utility>

#include "fp8kit/common/cpu.hpp"

namespace fp8kit::detail {

// Passes over arrays at memory speed, a few operations per element (the SIMD conversions, amax, the fused quantize
// and dequantize): elements.
inline constexpr std::int64_t kParallelStreamElements = std::int64_t{1} << 18;
// Element-by-element loops through the scalar codec or a plain float loop (Tensor::to's generic path, elementwise
// adds): elements.
inline constexpr std::int64_t kParallelLoopElements = std::int64_t{1} << 16;
// Elementwise math with a few dozen operations per element (AdamW, layer norm, GELU, softmax rows): elements.
inline constexpr std::int64_t kParallelMathElements = std::int64_t{1} << 15;
// Counter-based random numbers (a hash per element, then a transform): elements.
inline constexpr std::int64_t kParallelRandomElements = std::int64_t{1} << 14;
// The training layers' loops measured in multiply-adds or element visits (convolutions' im2col, attention, pooling).
inline constexpr double kParallelWork = 16384;
// A GEMV's weights (N x K elements) and a GEMM's epilogue (M x N outputs): elements.
inline constexpr double kParallelMmElements = 1.0e6;

// Whether `size` of work, against its kind's threshold, is worth the threads there are.
inline bool worth_threads(std::int64_t size, std::int64_t threshold) {
  return size >= threshold && num_threads() > 1;
}

// Nothing may leave an OpenMP region by an exception: it ends the process (std::terminate), whatever the team's size.
// A region whose work can throw (an allocation, a check, a memory limit) runs that work through guard(), and the
// caller calls rethrow() after the region: the first error thrown in it reaches the caller, which can catch it (the
// Python package turns it into an exception). After an error the other threads' remaining guarded work is skipped.
class RegionErrors {
 public:
  template <typename Work>
  void guard(Work&& work) noexcept {
    if (failed_.load(std::memory_order_relaxed)) return;
    try {
      std::forward<Work>(work)();
    } catch (...) {
      const std::lock_guard<std::mutex> lock(mutex_);
      if (!error_) error_ = std::current_exception();
      failed_.store(true, std::memory_order_relaxed);
    }
  }
  void rethrow() const {
    if (error_) std::rethrow_exception(error_);
  }

 private:
  std::atomic<bool> failed_{false};
  std::mutex mutex_;
  std::exception_ptr error_;
};

}  // namespace fp8kit::detail
