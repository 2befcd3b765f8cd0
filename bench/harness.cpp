// Benchmark harness implementation.
#include "harness.hpp"

#include <emmintrin.h>
#include <omp.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>

namespace fp8kit::bench {

Buffer::Buffer(std::size_t bytes) : bytes_(bytes) {
  const std::size_t rounded = (std::max<std::size_t>(bytes, 64) + 63) / 64 * 64;
  auto* p = static_cast<std::byte*>(std::aligned_alloc(64, rounded));
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, rounded);
  data_.reset(p);
}

void Buffer::Free::operator()(std::byte* p) const {
  std::free(p);
}

double median(std::vector<double> values) {
  if (values.empty()) return 0.0;
  std::sort(values.begin(), values.end());
  const std::size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

double time_once(const std::function<void()>& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  const auto stop = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(stop - start).count();
}

PairTiming time_interleaved(const std::function<void()>& kernel, const std::function<void()>& baseline, int reps) {
  kernel();  // warm-up: page tables, caches, thread pool
  baseline();
  std::vector<double> k, b;
  for (int r = 0; r < reps; ++r) {
    if (r % 2 == 0) {
      k.push_back(time_once(kernel));
      b.push_back(time_once(baseline));
    } else {
      b.push_back(time_once(baseline));
      k.push_back(time_once(kernel));
    }
  }
  return {median(k), median(b)};
}

std::uint64_t read_all(const void* data, std::size_t bytes, int threads) {
  // 128 bytes per step into 8 independent SSE2 accumulators (SSE2 is in every x86-64).
  const auto* p = static_cast<const __m128i*>(data);
  const std::size_t steps = bytes / 128;
  std::uint64_t total = 0;
#pragma omp parallel num_threads(threads) reduction(^ : total)
  {
    __m128i acc[8];
    for (auto& a : acc) a = _mm_setzero_si128();
#pragma omp for schedule(static)
    for (std::size_t s = 0; s < steps; ++s) {
      for (int j = 0; j < 8; ++j) acc[j] = _mm_add_epi64(acc[j], _mm_load_si128(p + s * 8 + j));
    }
    __m128i sum = acc[0];
    for (int j = 1; j < 8; ++j) sum = _mm_xor_si128(sum, acc[j]);
    total ^= static_cast<std::uint64_t>(_mm_cvtsi128_si64(sum)) ^
             static_cast<std::uint64_t>(_mm_cvtsi128_si64(_mm_unpackhi_epi64(sum, sum)));
  }
  // The last bytes % 128, so that every byte the GB/s counts is read (all of a buffer below 128 bytes).
  const auto* tail = static_cast<const std::uint8_t*>(data) + steps * 128;
  for (std::size_t i = 0; i < bytes % 128; ++i) total += tail[i];
  return total;
}

Timing measure(const std::function<void()>& kernel, const std::function<void()>& baseline, int reps, int threads,
               std::size_t bytes_moved, std::size_t baseline_bytes) {
  const PairTiming t = time_interleaved(kernel, baseline, reps);
  Timing m;
  m.threads = threads;
  m.reps = reps;
  m.bytes_moved = bytes_moved;
  m.seconds = t.kernel_seconds;
  m.baseline_seconds = t.baseline_seconds;
  m.gbps = static_cast<double>(bytes_moved) / t.kernel_seconds / 1e9;
  m.baseline_gbps = static_cast<double>(baseline_bytes) / t.baseline_seconds / 1e9;
  m.ratio = m.gbps / m.baseline_gbps;
  return m;
}

bool bind_openmp_threads(int threads) {
  if (std::getenv("OMP_PROC_BIND") != nullptr || threads < 1) return false;
  // The CPUs the process was started with, read before the first binding narrows the main thread's set.
  static const std::vector<int> cpus = [] {
    std::vector<int> list;
    cpu_set_t allowed;
    CPU_ZERO(&allowed);
    if (sched_getaffinity(0, sizeof(allowed), &allowed) == 0) {
      for (int c = 0; c < CPU_SETSIZE; ++c) {
        if (CPU_ISSET(c, &allowed)) list.push_back(c);
      }
    }
    return list;
  }();
  // More threads than CPUs: no one-per-CPU binding exists; every thread of the team (the main one too, which an
  // earlier call may have bound, and whose set new workers inherit) gets all the CPUs back.
  const bool one_each = static_cast<std::size_t>(threads) <= cpus.size();
  bool bound = true;
#pragma omp parallel num_threads(threads) reduction(&& : bound)
  {
    cpu_set_t set;
    CPU_ZERO(&set);
    if (one_each) {
      CPU_SET(cpus[static_cast<std::size_t>(omp_get_thread_num())], &set);
    } else {
      for (int c : cpus) CPU_SET(c, &set);
    }
    bound = pthread_setaffinity_np(pthread_self(), sizeof(set), &set) == 0;
  }
  return one_each && bound;
}

void parallel_memcpy(void* dst, const void* src, std::size_t bytes, int threads) {
  if (threads <= 1) {
    std::memcpy(dst, src, bytes);
    return;
  }
  const std::size_t per = (bytes / static_cast<std::size_t>(threads) + 63) / 64 * 64;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int t = 0; t < threads; ++t) {
    const std::size_t begin = std::min(bytes, per * static_cast<std::size_t>(t));
    const std::size_t end = std::min(bytes, begin + per);
    if (begin < end) std::memcpy(static_cast<char*>(dst) + begin, static_cast<const char*>(src) + begin, end - begin);
  }
}

}  // namespace fp8kit::bench
