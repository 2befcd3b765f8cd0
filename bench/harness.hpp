// The benchmark harness: aligned, pre-touched buffers; a monotonic timer; interleaved repetitions of a kernel
// and its baseline (ABAB...) reported as medians, so slow drift and noisy neighbours hit both sides alike.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace fp8kit::bench {

// A 64-byte aligned buffer, written once so its pages exist before timing.
class Buffer {
 public:
  explicit Buffer(std::size_t bytes);
  std::byte* data() { return data_.get(); }
  std::size_t size() const { return bytes_; }
  template <typename T>
  std::span<T> as() {
    return {reinterpret_cast<T*>(data_.get()), bytes_ / sizeof(T)};
  }

 private:
  struct Free {
    void operator()(std::byte* p) const;
  };
  std::unique_ptr<std::byte, Free> data_;
  std::size_t bytes_;
};

double median(std::vector<double> values);

// Seconds taken by fn().
double time_once(const std::function<void()>& fn);

struct PairTiming {
  double kernel_seconds;    // median
  double baseline_seconds;  // median
};
// Runs warmup rounds, then `reps` rounds of (kernel, baseline) alternating which goes first.
PairTiming time_interleaved(const std::function<void()>& kernel, const std::function<void()>& baseline, int reps);

// One measurement as every benchmark reports it: medians, throughputs and the ratio to the baseline.
struct Timing {
  int threads = 1;
  int reps = 0;                 // the repetitions the medians are of
  std::size_t bytes_moved = 0;  // bytes the kernel reads plus writes
  double seconds = 0;           // median
  double gbps = 0;
  double baseline_seconds = 0;  // median
  double baseline_gbps = 0;
  double ratio = 0;  // gbps / baseline_gbps
};

// Times kernel against baseline (interleaved, medians); the baseline moves `baseline_bytes` per run.
Timing measure(const std::function<void()>& kernel, const std::function<void()>& baseline, int reps, int threads,
               std::size_t bytes_moved, std::size_t baseline_bytes);

// Reads every byte of `data` (8 independent accumulators, so it is bound by memory, not add latency), split
// across `threads` threads; returns a value that depends on all of it so the reads cannot be optimized away.
std::uint64_t read_all(const void* data, std::size_t bytes, int threads);

// Binds thread t of the next `threads`-thread OpenMP teams to the t-th CPU this process may run on, as
// OMP_PROC_BIND=true does (which libgomp only reads at start-up). Unbound, the kernel scheduler may wake a worker on
// the CPU of the thread that woke it, and the two then share one CPU until the next load balance: on a 2-vCPU VM
// that added 4-8 ms (scheduler ticks) to ~1 ms two-thread kernels and probes at random, per process. Does nothing
// where OMP_PROC_BIND is set (the user's choice stands); where `threads` exceeds the CPUs, gives every thread all
// of them back instead. Call it after every library
// that starts threads of its own (OpenBLAS) is loaded: threads started later inherit the binding of their creator.
// Returns whether the threads are bound.
bool bind_openmp_threads(int threads);

// memcpy split across `threads` threads (each copies a contiguous part), the convention of the baseline.
void parallel_memcpy(void* dst, const void* src, std::size_t bytes, int threads);

}  // namespace fp8kit::bench
