// CPU feature detection (cpuid + xgetbv) and the thread count shared by every bulk operation.
#include "fp8kit/cpu.hpp"

#include <cpuid.h>
#include <omp.h>

#include <cstdint>
#include <cstring>

#include "fp8kit/error.hpp"

namespace fp8kit {
namespace {

std::uint64_t xgetbv0() {
  std::uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<std::uint64_t>(hi) << 32) | lo;
}

CpuFeatures detect() {
  CpuFeatures f;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
  const bool osxsave = (c >> 27) & 1;
  const bool avx = (c >> 28) & 1;
  const std::uint64_t xcr0 = osxsave ? xgetbv0() : 0;
  const bool ymm_state = (xcr0 & 0x6) == 0x6;
  const bool zmm_state = (xcr0 & 0xE6) == 0xE6;
  f.fma = avx && ymm_state && ((c >> 12) & 1);
  f.f16c = avx && ymm_state && ((c >> 29) & 1);
  if (__get_cpuid_count(7, 0, &a, &b, &c, &d)) {
    f.avx2 = avx && ymm_state && ((b >> 5) & 1);
    f.avx512f = zmm_state && ((b >> 16) & 1);
    f.avx512bw = f.avx512f && ((b >> 30) & 1);
    f.avx512vl = f.avx512f && ((b >> 31) & 1);
    f.avx512vbmi = f.avx512f && ((c >> 1) & 1);
  }
  if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) f.avx512bf16 = f.avx512f && ((a >> 5) & 1);
  char brand[49] = {};
  unsigned regs[12];
  if (__get_cpuid(0x80000000, &a, &b, &c, &d) && a >= 0x80000004) {
    for (unsigned i = 0; i < 3; ++i)
      __get_cpuid(0x80000002 + i, &regs[4 * i], &regs[4 * i + 1], &regs[4 * i + 2], &regs[4 * i + 3]);
    std::memcpy(brand, regs, 48);
    f.brand = brand;
    while (!f.brand.empty() && f.brand.back() == ' ') f.brand.pop_back();
    while (!f.brand.empty() && f.brand.front() == ' ') f.brand.erase(f.brand.begin());
  }
  return f;
}

}  // namespace

const CpuFeatures& cpu_features() {
  static const CpuFeatures features = detect();
  return features;
}

void set_num_threads(int n) {
  FP8KIT_CHECK(n >= 1, "thread count must be at least 1, got ", n);
  omp_set_num_threads(n);
}

int num_threads() {
  return omp_get_max_threads();
}

}  // namespace fp8kit
